"""The extract stage with each capture engine and the EAGLE-3 train stage on its features, at
Llama-3.1-8B's shape, each run a process of its own as dvc.yaml runs it: the rates the pipeline
itself reaches, beside those of its pieces alone (bench_extract, bench_extract_stage, bench_train)
and SpecForge's (docs/performance.md).

    python -m tests.perf.bench_llama_stages [--shape llama-3.1-8b|tiny] [--device auto|cpu|cuda]
        [--engines hf-eager hf-compiled sglang] [--train-batches 1 4] [--samples 64]
        [--length 2048] [--train-steps 13] [--drafters eagle3] [--work DIR] [--logs DIR]
        [--json-out FILE] [--timeout-s 240]

A random target of the shape (bench_multi_gpu.write_target: bf16 on a GPU, its LM head scaled up)
saved as a checkpoint under --work (kept for a rerun), and random merged samples all of --length
tokens (bench_multi_gpu.write_merged: --samples train, 4 eval), so a batch of B is B x --length
without padding, the shape SpecForge is timed at. Each run's params are params.yaml as
real_sglang.params writes them (the target in bf16 on a GPU, extract.sglang tp_size 1 and
mem_fraction_static 0.5) with extract.drafters --drafters (eagle3: 3 layers, 32 KiB a token).

1. extract (`stages.extract`) once per engine: `hf-eager` (extract.engine hf, compile false),
   `hf-compiled` (compile true), `sglang` (SGLang's model runner in-process; skipped, with the
   reason printed, without a GPU or SGLang). Each: the stage's own tokens/s (its loop after the
   warm-up) and warm-up, tokens over the process's wall, the tokens stored (index.parquet), the
   process's peak memory (CUDA max allocated; on the CPU max RSS) and the attention that ran.
   The stage runs through this script (`... bench_llama_stages stage stages.extract ARGS`: the
   stage's own main, one line printed at exit), which reads inside its process: for hf the
   attention implementation and the calls to each kernel of packing.py's packed attention
   (`_flash_varlen`: FlashAttention-2's varlen forward, on a GPU in bf16; `_per_sample`: sdpa
   per sample); for sglang the backend the model runner built (its class, its prefill backend
   and server_args.attention_backend as SGLang resolved them; the device bundles' shim picks
   triton). Each engine's features are deleted once measured, but hf-compiled's (else the first
   engine's), which train reads.
2. train (`stages.train`) once per --train-batches B: params.yaml's train section (compile auto,
   fp8 false) with ttt_steps 7 (SpecForge's), batch_size B, max_steps --train-steps (the first 3
   timed apart by the stage as its warm-up), one evaluation of 4 samples and one checkpoint, at
   the end; a draft vocabulary of 32,000 (tiny: 128) from the samples' supervised tokens
   (build_draft_vocab, as the vocab stage does; the stage needs duckdb, which the GPU machines
   lack). From its reports/train.json: tokens/s, warmup_s, `compiled` (the CPU trains eager),
   padding_share; its process's peak memory.

Each stage has --timeout-s; one that fails or times out is recorded with its error and the rest
still run. A line is printed per measurement, --json-out rewritten after each; a table at the end.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import save_file

from stages.artifacts import hidden
from stages.capture.releases import installed_sglang_version
from stages.drafter.training import WARMUP_STEPS
from stages.drafter.vocab import build_draft_vocab
from stages.extract import forward_tokens
from stages.params.extract import ExtractParams
from stages.runtime.device import resolve_device
from stages.runtime.files import write_json
from tests.perf.bench_extract import SHAPES, peak_memory_gib, print_table
from tests.perf.bench_kimi_width import free
from tests.perf.bench_multi_gpu import write_merged, write_target
from tests.perf.bench_train import DRAFT_VOCAB
from tests.perf.real_sglang import ROOT, params, run_logged

ENGINES = {  # each engine's extract section
    "hf-eager": {"engine": "hf", "compile": False},
    "hf-compiled": {"engine": "hf", "compile": True},
    "sglang": {"engine": "sglang"},
}
TRAIN_FEATURES = "hf-compiled"  # the features train reads (else the first engine's)
EVAL_SAMPLES = 4
TTT_STEPS = 7  # SpecForge's
SELF = "tests.perf.bench_llama_stages"
STAGE = "stage"  # this script's first argument when it runs a stage
FACTS = "[bench-facts] "  # the line a stage run through this script prints at exit
TAG = "[llama-stages]"


def stage_with_facts(module: str, argv: list[str]) -> None:
    """`python -m module argv` as the stage's own main runs it, printing at exit one line of what
    only its process sees: its peak memory and, for extract, the attention its capture ran."""
    from stages.capture import packing
    from stages.cli import run

    stage = importlib.import_module(module)
    facts: dict = {}
    if hasattr(stage, "build_capture"):
        kernels: Counter = Counter()
        for name in ("_flash_varlen", "_per_sample"):  # packed_attention calls one a layer
            setattr(packing, name, counted(getattr(packing, name), name, kernels))
        build = stage.build_capture

        def build_and_note(*args, **kwargs):
            capture = build(*args, **kwargs)
            facts["attention"] = {**capture_attention(capture), "packed_kernels": kernels}
            return capture

        stage.build_capture = build_and_note

    def say() -> None:
        device = torch.device("cuda" if torch.cuda.is_initialized() else "cpu")
        facts["peak_gib"] = round(peak_memory_gib(device), 2)
        print(FACTS + json.dumps(facts), flush=True)

    atexit.register(say)
    sys.argv = [module, *argv]
    run(stage.main)


def counted(fn: Callable, name: str, calls: Counter) -> Callable:
    def call(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)

    return call


def capture_attention(capture) -> dict:
    """The attention a built Capture runs: the hf engine's transformers implementation, or the
    backend SGLang's model runner built (with its prefill backend and the server args' choice as
    SGLang resolved them, where the release has them)."""
    adapter = getattr(capture, "runner", None)  # SGLangCapture's release adapter
    if adapter is None:
        return {"implementation": capture.model.config._attn_implementation}
    model_runner = adapter.runner
    backend = getattr(model_runner, "attn_backend", None)
    return {
        "implementation": None if backend is None else type(backend).__name__,
        "prefill": getattr(model_runner, "prefill_attention_backend_str", None),
        "server_args": getattr(adapter.server_args, "attention_backend", None),
    }


def stage_process(args, name: str, module: str, stage_args: list, p: Path) -> tuple[dict, float]:
    """The stage in a process of its own (through stage_with_facts), its log in --logs: (the
    facts it printed at exit, its wall seconds). Raises with its log's tail when it fails."""
    command = [sys.executable, "-m", SELF, STAGE, module, *map(str, stage_args), "--params", str(p)]
    start = time.monotonic()
    text = run_logged(args.logs / f"{name}.log", command, ROOT, args.timeout_s)
    wall = time.monotonic() - start
    lines = [line for line in text.splitlines() if line.startswith(FACTS)]
    return (json.loads(lines[-1].removeprefix(FACTS)) if lines else {}), wall


def on_target(p: dict, target: Path, device: torch.device) -> None:
    p["target"].update(path=str(target), device=device.type)
    if device.type != "cuda":
        p["target"]["dtype"] = "auto"  # float32 on the CPU


def measure_extract(args, name: str, target: Path, device: torch.device) -> dict:
    out, report = args.work / f"hidden-{name}", args.work / f"extract-{name}.json"
    shutil.rmtree(out, ignore_errors=True)  # extracted again, not resumed

    def change(p: dict) -> None:
        on_target(p, target, device)
        p["extract"].update(ENGINES[name], drafters=args.drafters)

    p = params(args.work, f"extract-{name}", change)
    merged = args.work / "merged"
    io = ["--merged", merged, "--out", out, "--report", report]
    facts, wall = stage_process(args, f"extract-{name}", "stages.extract", io, p)
    r = json.loads(report.read_text())
    stored = pq.read_table(out / hidden.INDEX, columns=["length"]).column("length")
    return {
        "tokens_per_s": r["tokens_per_s"],
        "wall_tokens_per_s": round(r["tokens"] / wall, 1),
        "wall_s": round(wall, 1),
        "warmup_s": r["warmup_s"],
        "loop_s": r["time"]["loop_s"],
        "tokens": r["tokens"],
        "extracted_tokens": r["extracted_tokens"],
        "stored_tokens": sum(stored.to_pylist()),
        "forward_tokens": forward_tokens(ExtractParams.read(p)),
        "bytes_per_token": r["bytes_per_token"],
        "aux_hf_indices": r["aux_hf_indices"],
        "attention": facts.get("attention"),
        "peak_gib": facts.get("peak_gib"),
        "features": str(out),
    }


def measure_train(args, batch: int, features: Path, target: Path, device: torch.device) -> dict:
    name = f"train-b{batch}"
    out = args.work / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not resumed

    def change(p: dict) -> None:
        on_target(p, target, device)
        train = p["train"]
        train.update(ttt_steps=TTT_STEPS, batch_size=batch, max_length=args.length)
        train.update(eval_max_samples=EVAL_SAMPLES, device=device.type)
        # evaluated and saved once, at the last step (the loop always does then)
        train.update(
            dict.fromkeys(("max_steps", "eval_every", "checkpoint_every"), args.train_steps)
        )

    p = params(args.work, name, change)
    io = ["--hidden-dir", features, "--vocab-file", args.work / "vocab" / "d2t_t2d.safetensors"]
    io += ["--checkpoint-dir", out / "checkpoints", "--out-dir", out / "drafter"]
    io += ["--report", out / "train.json", "--plots", out / "plots"]
    try:
        facts, wall = stage_process(args, name, "stages.train", io, p)
    finally:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # GBs at this shape
    r = json.loads((out / "train.json").read_text())
    kept = ("steps", "compiled", "compile_failed_at_step", "tokens_per_s", "warmup_s")
    kept += ("padding_share", "final_loss")
    return {**{k: r[k] for k in kept}, "peak_gib": facts.get("peak_gib"), "wall_s": round(wall, 1)}


def measured(what: Callable[[], dict]) -> dict:
    """`what`'s figures, or its error: a stage that fails or hangs costs only its own row."""
    try:
        return what()
    except subprocess.TimeoutExpired as err:
        return {"error": f"timed out after {err.timeout:.0f} s"}
    except Exception as err:
        return {"error": f"{type(err).__name__}: {err}"[-3000:]}


def sglang_missing(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "the sglang engine needs a GPU"
    if installed_sglang_version() is None:
        return "SGLang is not installed (importable) here"
    return None


def built_target(args, device: torch.device) -> Path:
    """The random target under --work, built unless one of this shape and device is there."""
    out = args.work / "target"
    marker, wanted = out / "bench_target", f"{args.shape} {device.type}"
    if marker.exists() and marker.read_text() == wanted:
        print(f"{TAG} reusing the target in {out}", flush=True)
        return out
    shutil.rmtree(out, ignore_errors=True)
    start = time.monotonic()
    write_target(args.shape, device, out)
    free(device)  # the bench's process keeps no copy on the GPU beside the stages'
    marker.write_text(wanted)
    print(
        f"{TAG} built a random {args.shape} target in {time.monotonic() - start:.0f} s", flush=True
    )
    return out


def write_samples(args) -> int:
    """The merged samples under --work and the draft vocabulary of their supervised tokens (as
    the vocab stage builds it); the samples' tokens."""
    shape, vocab = (args.length, args.length), SHAPES[args.shape]["vocab_size"]
    counts, tokens = write_merged(args.work / "merged", args.samples, shape, vocab, EVAL_SAMPLES)
    d2t, t2d, _ = build_draft_vocab(counts, DRAFT_VOCAB[args.shape])
    (args.work / "vocab").mkdir(parents=True, exist_ok=True)
    save_file({"d2t": d2t, "t2d": t2d}, str(args.work / "vocab" / "d2t_t2d.safetensors"))
    return tokens


def extract_each_engine(args, target: Path, device: torch.device, results: dict, save) -> None:
    """Each engine's extract in turn; the features train reads kept, the others deleted."""
    for name in args.engines:
        missing = sglang_missing(device) if name == "sglang" else None
        row = (
            {"skipped": missing}
            if missing
            else measured(lambda: measure_extract(args, name, target, device))
        )
        results["extract"][name] = row
        print(f"{TAG} extract {name}: {json.dumps(row)}", flush=True)
        if "error" in row:  # what it wrote before it failed
            shutil.rmtree(args.work / f"hidden-{name}", ignore_errors=True)
        if "features" in row:
            kept = results["train_features"]
            if kept is None or name == TRAIN_FEATURES:
                results["train_features"], unread = name, results["extract"].get(kept)
            else:
                unread = row
            if unread is not None:  # features train does not read
                shutil.rmtree(unread.pop("features"), ignore_errors=True)
        save()


def train_each_batch(args, target: Path, device: torch.device, results: dict, save) -> None:
    kept = results["train_features"]
    for batch in args.train_batches if kept else []:
        features = Path(results["extract"][kept]["features"])
        row = measured(lambda: measure_train(args, batch, features, target, device))
        results["train"].append({"batch_size": batch, **row})
        print(f"{TAG} train batch {batch}: {json.dumps(results['train'][-1])}", flush=True)
        save()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["llama-3.1-8b", "tiny"], default="llama-3.1-8b")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--train-batches", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--samples", type=int, default=64, help="train samples")
    parser.add_argument("--length", type=int, default=2048, help="tokens of every sample")
    parser.add_argument("--train-steps", type=int, default=13, help="train.max_steps")
    parser.add_argument("--drafters", nargs="+", default=["eagle3"], help="extract.drafters")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-llama-stages"))
    parser.add_argument("--logs", type=Path, help="each stage's log (default: --work/logs)")
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--timeout-s", type=int, default=240, help="per stage run")
    args = parser.parse_args(argv)
    if args.train_steps <= WARMUP_STEPS:
        parser.error(f"--train-steps: more than the stage's {WARMUP_STEPS} warm-up steps")
    if any(not 1 <= b <= args.samples for b in args.train_batches):
        parser.error("--train-batches: each from 1 to --samples")
    args.work = args.work.resolve()  # the stages run from the repository root
    args.logs = (args.logs or args.work / "logs").resolve()
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = resolve_device(args.device)
    args.logs.mkdir(parents=True, exist_ok=True)
    target = built_target(args, device)
    results: dict = {
        "shape": args.shape,
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "sglang": installed_sglang_version(),
        "samples": [args.samples, EVAL_SAMPLES],
        "length": args.length,
        "tokens": write_samples(args),
        "extract": {},
        "train_features": None,  # the engine whose features train read
        "train": [],
    }

    def save() -> None:  # atomic: a call killed mid-write keeps the last whole file
        if args.json_out:
            write_json(results, args.json_out)

    extract_each_engine(args, target, device, results, save)
    train_each_batch(args, target, device, results, save)
    print_report(results)
    return results


def print_report(r: dict) -> None:
    print(f"\n{r['shape']} on {r['gpu']}, {r['tokens']:,} tokens, torch {r['torch']}")
    rows = []
    for name, e in r["extract"].items():
        a = e.get("attention") or {}
        used = a.get("prefill") or ", ".join(a.get("packed_kernels") or {})
        attention = f"{a.get('implementation')}: {used}" if a else "-"
        figures = [e.get(k) for k in ("tokens_per_s", "wall_tokens_per_s", "wall_s", "warmup_s")]
        rows.append([f"extract {name}", *cells(e, figures, e.get("peak_gib")), attention])
    for t in r["train"]:
        figures = [t.get("tokens_per_s"), None, t.get("wall_s"), t.get("warmup_s")]
        compiled = {True: "compiled", False: "eager"}.get(t.get("compiled"), "-")
        rows.append(
            [f"train batch {t['batch_size']}", *cells(t, figures, t.get("peak_gib")), compiled]
        )
    columns = ["run", "stage tok/s", "tok/s over wall", "wall s", "warm-up s", "peak GiB"]
    print_table([*columns, "attention / step"], rows)


def cells(row: dict, figures: list, peak: float | None) -> list[str]:
    if "error" in row or "skipped" in row:
        return ["FAIL" if "error" in row else "skipped"] + ["-"] * 4
    return [f"{v:,.1f}" if v is not None else "-" for v in [*figures, peak]]


if __name__ == "__main__":
    if sys.argv[1:2] == [STAGE]:
        stage_with_facts(sys.argv[2], sys.argv[3:])
    else:
        main()
