"""Extraction, training and export at Kimi-K2.5's widths: the real stage code on a random
DeepSeek-V3 target with Kimi-K2.5's widths (hidden 7168, vocab 163,840, MLA q_lora 1536 / kv_lora
512 / qk_nope 128 / qk_rope 64 / v 128, 64 heads, MoE 2048 wide + 1 shared expert, dense MLP 18432,
yarn factor 64 over 4,096 positions, theta 50,000, 262,144 positions) and as many layers and
experts as one GPU holds.

    python -m tests.perf.bench_kimi_width [--shape kimi-k2.5|tiny] [--device auto|cpu|cuda]
        [--layers 6] [--experts 16] [--experts-per-token 8] [--lengths 4096 8192]
        [--samples 2] [--batch-size 1] [--intermediate 18432] [--train-steps 6] [--warmup 2]
        [--repeat 5] [--stores all supervised none] [--compile] [--fp8] [--work /tmp/kimi-width]
        [--json-out FILE]

The target is built in bf16 directly on the GPU (HF's initialisation, std 0.02) and saved as a
sharded safetensors checkpoint under --work (kept and reused while its config is the same), so
the stages load it the way they load a real one. Then, for each sequence length and each
feature store of --stores (`extract.store`; default all), at batch --batch-size (default 1; every
sample of a row has its length, so a batch holds no padding and the stage and the step run the
same shape):

(a) extract: `stages.extract.extract` on a merged split written with the merge stage's columns
    (random token ids, one supervised span per sample; --samples train samples and one eval
    sample, each its own shard and its own forward): the stage's own tokens/s (its shard loop:
    forward, host copies, shard writes; at 6 layers the copies and writes weigh far more than
    they do behind 61), the peak GPU memory (model included) and the feature bytes stored per
    token (`supervised`: the rows and final states the loss reads; `none`: token ids only);
(b) train: `stages.train.main`, the train stage itself with a params file, for --train-steps
    optimizer steps on those features (7 TTT steps, draft vocabulary 32,000, the draft shape that
    Eagle3Config.from_target derives: hidden 7168, 64 heads, head_dim 128, MLP --intermediate),
    one evaluation at the end, a checkpoint (the drafter in fp32 and its AdamW state, about
    14 GB at these widths): `stage tok/s` is the stage's own figure (training steps only, after
    the first 3, which compile flex attention and the loss and are timed apart; --compile and
    --fp8 set `train.compile` and `train.fp8`, and those 3 steps then compile the objective)
    and `stage peak GiB` its peak GPU memory. Then the same step (`training_step`, the drafter
    built as the stage builds it) on the first extracted sample, timed as bench_train times it:
    `train tok/s` and `ms/step`, the median of --repeat steps after --warmup, and `train peak
    GiB`.
    With store `none` (online) the stage loads the target beside the drafter and runs it on
    every batch, and the timed step includes that forward (`stages.wiring.online_features`);
(c) export: the train stage exports the best checkpoint for SGLang 0.5.16 (`export_drafter`) and
    checks it key by key (`check_export`); it is checked again here and `pass` is printed. When
    training did not finish, the untrained drafter is exported and checked instead.

A row that runs out of GPU memory prints OOM in its columns and the next row runs. On a GPU a
warm-up extraction of one short sample runs first, so the first row's rate carries no CUDA
start-up (--no-warmup skips it). Prints a table and, with --json-out, writes the figures as JSON
(rewritten after each row).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import transformers
import yaml
from safetensors.torch import save_file
from transformers import AutoConfig

from stages import train as train_stage
from stages.artifacts.hidden import STORES, HiddenStates, collate, read_meta
from stages.artifacts.merged import COLUMNS
from stages.drafter.export import check_export, export_drafter
from stages.drafter.layers import default_aux_indices, serving_layer_ids
from stages.drafter.model import target_facts
from stages.drafter.training import (
    Objective,
    adamw,
    autocast_for,
    compiled_objective,
    compiles,
    feature_dtype,
    training_step,
)
from stages.drafter.vocab import build_draft_vocab
from stages.extract import extract
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.params.train import TrainParams
from stages.runtime.device import resolve_device
from stages.target_model.weights import embedding_and_head
from stages.wiring.online_features import online_features
from tests.mla_target import SHAPES, build_target, deepseek_config, save_target
from tests.perf.bench_extract import (
    median_seconds,
    peak_memory_gib,
    print_table,
    reset_peak_memory,
)

SGLANG_VERSION = "0.5.16"
DRAFT_VOCAB = {"kimi-k2.5": 32000, "tiny": 256}
DEFAULTS = {  # (layers, routed experts, experts per token) per shape
    "kimi-k2.5": (6, 16, 8),
    "tiny": (8, 4, 2),
}
OOM = "OOM"


def aux_indices(layers: int) -> list[int]:
    """EAGLE-3's default [2, N//2, N-3] where it has three distinct layers, else [2, 3, N-1]."""
    try:
        return default_aux_indices(layers)
    except ValueError:
        return [2, 3, layers - 1]


def target_dir(args, device: torch.device) -> Path:
    """The random target's checkpoint under --work, built unless one of the same config is
    there."""
    cfg = deepseek_config(
        args.shape,
        num_hidden_layers=args.layers,
        n_routed_experts=args.experts,
        num_experts_per_tok=args.experts_per_token,
    )
    out = args.work / "target"
    wanted = cfg.to_diff_dict()
    marker = out / "bench_config.json"
    if marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(wanted)):
        print(f"[kimi-width] reusing the target in {out}", flush=True)
        return out
    shutil.rmtree(out, ignore_errors=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    start = time.monotonic()
    model = build_target(cfg, device, dtype)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"[kimi-width] built a random {args.shape} target: {args.layers} layers, "
        f"{args.experts} routed experts ({args.experts_per_token} per token) + "
        f"{cfg.n_shared_experts} shared, {params / 1e9:.2f}B parameters, {dtype}, "
        f"{time.monotonic() - start:.0f} s",
        flush=True,
    )
    start = time.monotonic()
    save_target(model, out, tokenizer_dir=None, max_shard_size="5GB")
    del model
    free(device)
    marker.write_text(json.dumps(wanted, indent=2))
    print(f"[kimi-width] saved to {out} in {time.monotonic() - start:.0f} s", flush=True)
    return out


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def write_merged(out: Path, length: int, samples: int, vocab: int, seed: int) -> torch.Tensor:
    """`samples` train samples and one eval sample of `length` random ids, each supervised from
    length // 8 on (one span, as a last_turn reply); the supervised tokens' counts."""
    g = torch.Generator().manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    counts = torch.zeros(vocab, dtype=torch.int64)
    for split, n in (("train", samples), ("eval", 1)):
        rows = []
        for i in range(n):
            ids = torch.randint(vocab, (length,), generator=g)
            span = [length // 8, length]
            if split == "train":
                counts += torch.bincount(ids[span[0] :], minlength=vocab)
            rows.append(
                dict(
                    sample_id=f"{split}/{i:05d}",
                    dataset="random",
                    input_ids=ids.tolist(),
                    loss_spans=[span],
                    length=length,
                    truncated=False,
                    split=split,
                )
            )
        table = pa.Table.from_pylist(rows).select(list(COLUMNS))
        pq.write_table(table, out / f"{split}.parquet")
    return counts


def run_extract(
    merged: Path,
    hidden: Path,
    target: Path,
    device: torch.device,
    length: int,
    aux: list[int],
    store: str = "all",
) -> dict:
    params = ExtractParams(
        layers=aux, shard_tokens=length, batch_tokens=length, dtype="bfloat16", store=store
    )
    target_params = TargetParams(path=str(target), device=str(device))
    return extract(merged, hidden, params, target_params).to_json()


def write_params(path: Path, args, target: Path, device: torch.device, length: int) -> None:
    draft = {"intermediate_size": args.intermediate} if args.intermediate else {}
    params = {
        "target": {"path": str(target), "device": str(device)},
        "train": {
            "ttt_steps": args.ttt_steps,
            "max_steps": args.train_steps,
            "batch_size": args.batch_size,
            "max_length": length,
            "lr": 1e-4,
            "warmup_ratio": 0.0,
            "eval_every": args.train_steps,
            "eval_max_samples": 1,
            "checkpoint_every": args.train_steps,
            "device": str(device),
            "compile": args.compile,
            "fp8": args.fp8,
            "draft": draft,
            "sglang_version": SGLANG_VERSION,
        },
    }
    path.write_text(yaml.safe_dump(params))


def run_train(work: Path, params: Path, vocab: Path, hidden: Path) -> dict:
    train_stage.main(
        hidden_dir=hidden,
        vocab_file=vocab,
        checkpoint_dir=work / "checkpoints",
        out_dir=work / "drafter",
        report=work / "train.json",
        plots=work / "plots",
        params=params,
    )
    return json.loads((work / "train.json").read_text())


def time_train_step(
    params: Path, vocab: Path, hidden: Path, target: Path, device: torch.device, args
) -> dict:
    """The train stage's step (`training_step`: TTT forward, backward, clip, AdamW) on the first
    --batch-size extracted train samples, built as the stage builds it (compiled, with FP8
    products, as its params say), timed as bench_train times it: the median of --repeat steps
    after --warmup, so compilation and start-up stay out of the rate.
    Online (store none) each step first runs the target on the batch, as the stage does."""
    p = TrainParams.read(params)
    meta = read_meta(hidden)
    features = (
        online_features(
            ExtractParams.read(params),
            TargetParams.read(params),
            meta,
            device,
            meta.aux_hf_indices,
        )
        if meta.store == "none"
        else lambda batch: batch
    )
    target_config = AutoConfig.from_pretrained(target, local_files_only=True)
    drafter = train_stage.build_drafter(target_config, meta.aux_hf_indices, vocab, p.draft)
    embed, head = embedding_and_head(target)
    objective = Objective(drafter, embed, head, p.ttt_steps, p.decay).place(device)
    del embed, head
    drafter.use_fp8(p.fp8)
    model = compiled_objective(objective) if compiles(p.compile, device) else objective
    weights = [q for q in drafter.parameters() if q.requires_grad]
    opt = adamw(weights, p.lr, p.weight_decay, device)
    autocast = autocast_for(device)
    states = HiddenStates(hidden, "train", p.max_length)
    samples = [states[i] for i in range(p.batch_size)]
    batch = {k: v.to(device) for k, v in collate(samples, feature_dtype(device)).items()}
    tokens = int(batch["attention_mask"].sum())
    reset_peak_memory(device)
    seconds = median_seconds(
        lambda: training_step(model, features(batch), weights, opt, p.grad_clip, autocast),
        device,
        args.warmup,
        args.repeat,
    )
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "ms_per_step": round(1e3 * seconds, 1),
        "peak_gib": round(peak_memory_gib(device), 2),
    }


def export_untrained(work: Path, params: Path, vocab: Path, hidden: Path, target: Path) -> None:
    """What the train stage would export, from a fresh drafter (when training did not finish)."""
    p = TrainParams.read(params)
    meta = read_meta(hidden)
    target_config = AutoConfig.from_pretrained(target, local_files_only=True)
    drafter = train_stage.build_drafter(target_config, meta.aux_hf_indices, vocab, p.draft)
    export_drafter(
        drafter,
        drafter.cfg,
        work / "drafter",
        target_config,
        extra={"training": p.__dict__, "hidden_meta": meta.to_json(), "untrained": True},
        sglang_version=SGLANG_VERSION,
    )


def check(drafter_dir: Path, target: Path, aux: list[int]) -> dict:
    """check_export again on the written directory, and the ids and shapes it holds."""
    target_config = AutoConfig.from_pretrained(target, local_files_only=True)
    check_export(drafter_dir, target_config, aux, sglang_version=SGLANG_VERSION)
    written = json.loads((drafter_dir / "config.json").read_text())
    return {
        "check_export": "pass",
        "sglang_layer_ids": written["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        "vllm_layer_ids": written["eagle_aux_hidden_state_layer_ids"],
        "draft": {
            k: written[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "intermediate_size",
                "draft_vocab_size",
                "rope_scaling",
            )
        },
    }


def bench_length(
    args, length: int, store: str, target: Path, device: torch.device, aux: list[int]
) -> dict:
    work = args.work / (f"T{length}" if store == "all" else f"T{length}-{store}")
    shutil.rmtree(work, ignore_errors=True)
    vocab_size = SHAPES[args.shape]["vocab_size"]
    counts = write_merged(work / "merged", length, args.samples, vocab_size, seed=length)
    d2t, t2d, _ = build_draft_vocab(counts, args.draft_vocab)
    vocab = work / "d2t_t2d.safetensors"
    save_file({"d2t": d2t, "t2d": t2d}, str(vocab))
    params = work / "params.yaml"
    write_params(params, args, target, device, length)
    hidden = work / "hidden"
    row: dict = {"length": length, "batch": args.batch_size, "store": store}

    reset_peak_memory(device)
    try:
        report = run_extract(work / "merged", hidden, target, device, length, aux, store)
    except torch.cuda.OutOfMemoryError as err:
        row["extract"] = {"error": OOM, "message": str(err).splitlines()[0]}
    else:
        row["extract"] = {
            "tokens_per_s": report["tokens_per_s"],
            "tokens": report["tokens"],
            "peak_gib": round(peak_memory_gib(device), 2),
            "bytes_per_token": report["bytes_per_token"],
            "bytes_per_token_all": report["bytes_per_token_all"],
        }
    free(device)
    print(f"[kimi-width] T={length} {store} extract: {row['extract']}", flush=True)
    if "error" in row["extract"]:
        row["train"] = row["step"] = row["export"] = {"error": "no features"}
        return row

    reset_peak_memory(device)
    start = time.monotonic()
    try:
        report = run_train(work, params, vocab, hidden)
    except torch.cuda.OutOfMemoryError as err:
        row["train"] = {"error": OOM, "message": str(err).splitlines()[0]}
    else:
        row["train"] = {
            "tokens_per_s": report["tokens_per_s"],
            "steps": report["steps"],
            "final_loss": report["final_loss"],
            "target_forward_share": report["target_forward_share"],
            "peak_gib": round(peak_memory_gib(device), 2),
            "wall_s": round(time.monotonic() - start, 1),
        }
    free(device)
    print(f"[kimi-width] T={length} {store} train stage: {row['train']}", flush=True)

    try:
        row["step"] = time_train_step(params, vocab, hidden, target, device, args)
    except torch.cuda.OutOfMemoryError as err:
        row["step"] = {"error": OOM, "message": str(err).splitlines()[0]}
    free(device)
    print(f"[kimi-width] T={length} {store} train step: {row['step']}", flush=True)

    trained = "error" not in row["train"]
    try:
        if not trained:
            export_untrained(work, params, vocab, hidden, target)
        row["export"] = {**check(work / "drafter", target, aux), "trained": trained}
    except Exception as err:  # reported in the table, the next row still runs
        row["export"] = {"error": f"{type(err).__name__}: {err}"}
    print(f"[kimi-width] T={length} {store} export: {row['export']}", flush=True)
    if not args.keep:
        for name in ("checkpoints", "hidden"):
            shutil.rmtree(work / name, ignore_errors=True)
    free(device)
    return row


def cell(part: dict, key: str, fmt: str) -> str:
    if "error" in part:
        return OOM if part["error"] == OOM else "-"
    return format(part[key], fmt)


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for r in rows:
        e, t, st, x = r["extract"], r["train"], r["step"], r["export"]
        if "error" in x:
            export = "-" if x["error"] == "no features" else "FAIL"
        else:
            export = "pass" if x["trained"] else "pass (untrained)"
        out.append(
            [
                str(r["length"]),
                str(r["batch"]),
                r["store"],
                cell(e, "tokens_per_s", ",.0f"),
                cell(e, "peak_gib", ".2f"),
                cell(e, "bytes_per_token", ","),
                cell(st, "tokens_per_s", ",.0f"),
                cell(st, "ms_per_step", ",.1f"),
                cell(st, "peak_gib", ".2f"),
                cell(t, "tokens_per_s", ",.0f"),
                cell(t, "peak_gib", ".2f"),
                export,
            ]
        )
    return out


COLUMNS_PRINTED = [
    "length",
    "batch",
    "store",
    "extract tok/s",
    "extract peak GiB",
    "bytes/token",
    "train tok/s",
    "ms/step",
    "train peak GiB",
    "stage tok/s",
    "stage peak GiB",
    "export",
]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(DEFAULTS), default="kimi-k2.5")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--layers", type=int, help="decoder layers (default 6; tiny 8)")
    parser.add_argument("--experts", type=int, help="routed experts (default 16; tiny 4)")
    parser.add_argument(
        "--experts-per-token", type=int, help="routed experts per token (default 8; tiny 2)"
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--samples", type=int, default=2, help="train samples per length")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="train.batch_size, and the timed step's batch (the first samples; at most --samples)",
    )
    parser.add_argument(
        "--intermediate",
        type=int,
        default=None,
        help="the draft MLP width (train.draft.intermediate_size; default: the target's dense "
        "MLP, 18432 at Kimi widths; 12288 is the published Kimi drafters')",
    )
    parser.add_argument("--draft-vocab", type=int, help="default 32000 (tiny 256)")
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--train-steps", type=int, default=10, help="the train stage's steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before the timing")
    parser.add_argument("--repeat", type=int, default=5, help="timed steps (the median counts)")
    parser.add_argument(
        "--stores",
        nargs="+",
        default=["all"],
        choices=list(STORES),
        help="extract.store of each row: all, supervised (what the loss reads), none (online: "
        "the train stage runs the target)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="train.compile (on a GPU; the CPU runs eager)"
    )
    parser.add_argument("--fp8", action="store_true", help="train.fp8 (with --compile, a GPU)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kimi-width"))
    parser.add_argument(
        "--keep", action="store_true", help="keep each row's features and checkpoints"
    )
    parser.add_argument(
        "--no-warmup", action="store_true", help="skip the warm-up extraction (GPU only)"
    )
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    layers, experts, per_token = DEFAULTS[args.shape]
    args.layers = args.layers or layers
    args.experts = args.experts or experts
    args.experts_per_token = args.experts_per_token or per_token
    args.draft_vocab = args.draft_vocab or DRAFT_VOCAB[args.shape]
    if args.layers < 5:
        parser.error("--layers: at least 5 (three ascending aux indices from 2 to N-1)")
    if args.fp8 and not args.compile:
        parser.error("--fp8 runs compiled only (train.fp8 needs train.compile): add --compile")
    if args.train_steps < 1 or args.samples < 1:
        parser.error("--train-steps and --samples must be at least 1")
    if not 1 <= args.batch_size <= args.samples:
        parser.error(f"--batch-size: 1 to --samples ({args.samples}), the step's batch is theirs")

    device = resolve_device(args.device)
    args.work.mkdir(parents=True, exist_ok=True)
    target = target_dir(args, device)
    aux = aux_indices(args.layers)
    target_config = AutoConfig.from_pretrained(target, local_files_only=True)
    facts = target_facts(target_config)
    ids = serving_layer_ids(facts.architecture, aux, facts.num_hidden_layers, SGLANG_VERSION)
    results: dict = {
        "shape": args.shape,
        "device": device.type,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "target": {
            "layers": args.layers,
            "routed_experts": args.experts,
            "experts_per_token": args.experts_per_token,
            "hidden_size": facts.hidden_size,
            "vocab_size": facts.vocab_size,
            "aux_hf_indices": aux,
            "serving_layer_ids": ids,
        },
        "train": {
            "ttt_steps": args.ttt_steps,
            "steps": args.train_steps,
            "draft_vocab": args.draft_vocab,
            "intermediate": args.intermediate or facts.intermediate_size,
            "compile": args.compile,
            "fp8": args.fp8,
            "sglang_version": SGLANG_VERSION,
        },
        "rows": [],
    }

    def save() -> None:
        if args.json_out:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            args.json_out.write_text(json.dumps(results, indent=2) + "\n")

    if device.type == "cuda" and not args.no_warmup:
        # CUDA context, cuBLAS and the kernels, so that the first row's rate is the stage's own
        warm = args.work / "warmup"
        shutil.rmtree(warm, ignore_errors=True)
        write_merged(warm / "merged", 256, 1, facts.vocab_size, seed=0)
        run_extract(warm / "merged", warm / "hidden", target, device, 256, aux)
        shutil.rmtree(warm, ignore_errors=True)
        free(device)

    for length in args.lengths:
        for store in args.stores:
            results["rows"].append(bench_length(args, length, store, target, device, aux))
            save()
    print(
        f"\nKimi-K2.5 widths ({args.shape}): {args.layers} layers, {args.experts} routed experts "
        f"({args.experts_per_token} per token), aux {aux} (SGLang ids {ids['sglang']}, vLLM "
        f"{ids['vllm']}); draft vocab {args.draft_vocab}, {args.ttt_steps} TTT steps, "
        f"{args.train_steps} train steps; {results['gpu']}, torch {torch.__version__}"
    )
    print_table(COLUMNS_PRINTED, table_rows(results["rows"]))
    save()
    return results


if __name__ == "__main__":
    main()
