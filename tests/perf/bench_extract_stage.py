"""The extract stage against its own forward, in one process: the compiled forward alone, as
bench_extract --compile times it, and the real stage end to end at the same shapes.

    python -m tests.perf.bench_extract_stage [--shape llama-3.1-8b|tiny] [--device auto|cpu|cuda]
        [--samples 1600] [--lengths 1024 2048] [--batch-tokens 8192] [--shard-tokens 65536]
        [--writers 3] [--compile | --no-compile] [--forward-batch 4x2048] [--warmup 3]
        [--repeat 10] [--keep-shards 2] [--check-samples 4] [--work DIR] [--json-out FILE]

1. A random target of the shape (bench_extract.build_target) on the device, saved as a local
   checkpoint under --work; random merged samples (bench_multi_gpu.write_merged: lengths drawn
   from --lengths, two supervised spans each).
2. Reference features: the first --check-samples samples each run alone, eager, before anything
   is compiled.
3. (a) The forward alone: FeatureExtractor over --forward-batch, each decoder layer compiled for
   that shape, the median of --repeat calls after --warmup (bench_extract --compile).
4. (b) The stage: `stages.extract.extract` on the merged data and the saved checkpoint with
   extract.compile, batch_tokens, shard_tokens and writers as given: samples packed into rows of
   batch_tokens, features copied out of the device while the next rows run, shards written,
   fsynced and hashed by the writer threads, then the index. Its own tokens/s is the extraction
   loop after the warm-up (compilation on a synthetic row, then one sample); the warm-up is
   printed apart, and where the loop's time went (report's `time`): the device's forwards and
   copies out, the host waiting for copies and for a free writer, the writes left once the last
   features landed (paid once a run: the row "before its last writes" is the rate a longer run
   tends to), and the writers' writing + sha256 and fsync + rename. A thread beside the stage
   deletes each finished shard after the first --keep-shards, so the run needs a few shards of
   disk, not all of them (a minute at Llama-8B widths, 32 KiB a token, is about 75 GiB).
5. The kept first shard's first samples against the references: the largest relative error
   ||stage - alone|| / ||alone|| of aux and last. The stage's kernels (packed flash attention,
   compiled layers) differ from the reference's, and random weights amplify that with depth
   (bench_capture_noise.py takes it apart; docs/performance.md, "the capture's noise floor");
   attention leaking from one sample into the next shows as an error near 1 at the tiny shape.

On a GPU the goal is a stage at 90% or more of the forward alone (`x forward`). Prints a table and,
with --json-out, writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
import transformers
from safetensors import safe_open
from torch._dynamo.utils import counters

from stages.artifacts import hidden
from stages.capture.hooks import FeatureExtractor, compile_layers
from stages.drafter.layers import default_aux_indices
from stages.extract import extract
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.runtime.device import resolve_device
from stages.runtime.files import CHECKSUM_SUFFIX, remove_with_checksum
from tests.perf.bench_extract import (
    SHAPES,
    batch_shape,
    build_target,
    median_seconds,
    print_table,
)
from tests.perf.bench_kimi_width import free
from tests.perf.bench_multi_gpu import write_merged


class ShardReaper(threading.Thread):
    """Deletes each shard the stage has finished (its checksum beside it) from the keep-th on,
    while the stage runs: the disk holds the kept shards and those being written."""

    def __init__(self, folder: Path, keep: int):
        super().__init__(daemon=True)
        self.folder, self.keep = folder, keep
        self.done = threading.Event()
        self.deleted = 0

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.sweep()

    def sweep(self) -> None:
        for sums in self.folder.glob(f"shard-*.safetensors{CHECKSUM_SUFFIX}"):
            shard = self.folder / sums.name.removesuffix(CHECKSUM_SUFFIX)
            if hidden.shard_number(shard) >= self.keep:
                remove_with_checksum(shard)
                self.deleted += 1

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.sweep()


def first_samples(merged: Path, n: int) -> list[list[int]]:
    """The input_ids of the first n train samples: the start of the first shard."""
    table = pq.read_table(merged / "train.parquet", columns=["input_ids"]).slice(0, n)
    return table.column("input_ids").to_pylist()


def alone(extractor: FeatureExtractor, samples: list[list[int]], device: torch.device):
    """(aux, last) of each sample run by itself, in float32 on the CPU."""
    out = []
    for ids in samples:
        x = torch.tensor([ids], device=device)
        aux, last = extractor(x, torch.ones_like(x))
        out.append((aux[0].float().cpu(), last[0].float().cpu()))
    return out


def time_forward(model, extractor: FeatureExtractor, args, device: torch.device) -> dict:
    """(a): the forward alone over one --forward-batch, as bench_extract times it."""
    batch, length = args.forward_batch
    if args.compile:
        compile_layers(model, dynamic=False)
    ids = torch.randint(model.config.vocab_size, (batch, length), device=device)
    mask = torch.ones_like(ids)
    start = time.monotonic()
    seconds = median_seconds(lambda: extractor(ids, mask), device, args.warmup, args.repeat)
    return {
        "batch": f"{batch}x{length}",
        "tokens_per_s": round(batch * length / seconds, 1),
        "ms_per_call": round(1e3 * seconds, 1),
        "wall_s": round(time.monotonic() - start, 1),
    }


def run_stage(args, merged: Path, target: Path, out: Path, device: torch.device) -> dict:
    """(b): the stage itself, its finished shards deleted beside it from the keep-th on."""
    params = ExtractParams(
        shard_tokens=args.shard_tokens,
        batch_tokens=args.batch_tokens,
        compile=args.compile,
        writers=args.writers,
    )
    reaper = ShardReaper(out, args.keep_shards)
    graphs = counters["stats"]["unique_graphs"]
    reaper.start()
    start = time.monotonic()
    try:
        target_params = TargetParams(path=str(target), device=str(device))
        report = extract(merged, out, params, target_params).to_json()
    finally:
        reaper.stop()
    report["wall_s"] = round(time.monotonic() - start, 1)  # with loading the target
    report["graphs_compiled"] = counters["stats"]["unique_graphs"] - graphs
    report["shards_deleted"] = reaper.deleted
    return report


def largest_error(out: Path, references: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """max over the first shard's first samples and over aux, last of ||got - want|| / ||want||."""
    worst, offset = 0.0, 0
    with safe_open(str(hidden.shard_path(out, 0)), "pt") as shard:
        for want_aux, want_last in references:
            rows = slice(offset, offset + len(want_aux))
            for name, want in (("aux", want_aux), ("last", want_last)):
                got = shard.get_slice(name)[rows].float()
                worst = max(worst, float((got - want).norm() / want.norm()))
            offset += len(want_aux)
    return worst


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--samples", type=int, default=1600, help="train samples")
    parser.add_argument(
        "--lengths", type=int, nargs=2, default=[1024, 2048], help="shortest and longest sample"
    )
    parser.add_argument("--batch-tokens", type=int, default=8192, help="extract.batch_tokens")
    parser.add_argument("--shard-tokens", type=int, default=65536, help="extract.shard_tokens")
    parser.add_argument("--writers", type=int, default=3, help="extract.writers")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="extract.compile, and the forward alone compiled (default: on a GPU)",
    )
    parser.add_argument("--forward-batch", type=batch_shape, default=batch_shape("4x2048"))
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls of the forward")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls of the forward")
    parser.add_argument("--keep-shards", type=int, default=2, help="shards left on disk")
    parser.add_argument("--check-samples", type=int, default=4, help="samples checked")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-extract-stage"))
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    if args.keep_shards < 1 or args.check_samples < 1:
        parser.error("--keep-shards and --check-samples: at least 1 (the first shard is checked)")
    device = resolve_device(args.device)
    args.compile = device.type == "cuda" if args.compile is None else args.compile
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shutil.rmtree(args.work, ignore_errors=True)

    start = time.monotonic()
    torch.manual_seed(0)
    model = build_target(args.shape, device, dtype)
    model.save_pretrained(args.work / "target")
    vocab = SHAPES[args.shape]["vocab_size"]
    _, tokens = write_merged(
        args.work / "merged", args.samples, tuple(args.lengths), vocab, eval_samples=4
    )
    extractor = FeatureExtractor(model, default_aux_indices(model.config.num_hidden_layers))
    references = alone(extractor, first_samples(args.work / "merged", args.check_samples), device)
    print(
        f"[bench] {args.shape} target and {tokens:,} tokens of merged samples in {args.work} "
        f"({time.monotonic() - start:.0f} s)",
        flush=True,
    )
    forward = time_forward(model, extractor, args, device)
    print(f"[bench] forward alone: {forward}", flush=True)
    del model, extractor
    free(device)
    torch._dynamo.reset()  # the stage compiles on its own, as in a run of its own

    out = args.work / "hidden"
    stage = run_stage(args, args.work / "merged", args.work / "target", out, device)
    stage["max_rel_error"] = largest_error(out, references)
    ratio = stage["tokens_per_s"] / forward["tokens_per_s"]
    # the rate a longer run tends to: the writes left after the last features landed are paid
    # once a run, whatever its length
    t = stage["time"]
    steady = stage["extracted_tokens"] / max(t["loop_s"] - t["last_writes_s"], 1e-9)
    results = {
        "shape": args.shape,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "forward": forward,
        "stage": stage,
        "stage_vs_forward": round(ratio, 3),
        "stage_before_last_writes_tokens_per_s": round(steady, 1),
        "stage_before_last_writes_vs_forward": round(steady / forward["tokens_per_s"], 3),
    }
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2))
    print(
        f"[bench] the stage's loop, {t['loop_s']:.1f} s: device forwards {t['forward_s']:.1f} s, "
        f"copies out {t['copy_s']:.1f} s (beside the forwards); the host waited "
        f"{t['landed_wait_s']:.1f} s for copies, {t['buffers_wait_s']:.1f} s for host buffers, "
        f"{t['writer_wait_s']:.1f} s for a free writer; "
        f"the last writes went on {t['last_writes_s']:.1f} s after the last features landed; "
        f"the {args.writers} writers spent {t['save_s']:.1f} s writing + sha256, "
        f"{t['seal_s']:.1f} s on fsync + rename; host buffers allocated in {t['buffers_s']:.1f} s "
        f"beside the warm-up; graphs compiled {stage['graphs_compiled']}; "
        f"{stage['shards_deleted']} of {stage['shards']} shards deleted behind the stage"
    )
    print_table(
        ["run", "tokens", "tokens/s", "x forward", "warm-up s", "max rel error"],
        [
            [
                f"forward alone {forward['batch']}",
                f"{args.forward_batch[0] * args.forward_batch[1]:,}",
                f"{forward['tokens_per_s']:,.0f}",
                "1.00",
                "-",
                "-",
            ],
            [
                "stage",
                f"{stage['extracted_tokens']:,}",
                f"{stage['tokens_per_s']:,.0f}",
                f"{ratio:.2f}",
                f"{stage['warmup_s']:.1f}",
                f"{stage['max_rel_error']:.2e}",
            ],
            [
                "stage, before its last writes",
                f"{stage['extracted_tokens']:,}",
                f"{steady:,.0f}",
                f"{steady / forward['tokens_per_s']:.2f}",
                "-",
                "-",
            ],
        ],
    )
    return results


if __name__ == "__main__":
    main()
