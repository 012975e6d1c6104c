"""The merge stage at scale: synthetic raw generations in the raw artifact's schema, merged by the
real stage in a process of its own, timed, its peak memory read back.

    python -m tests.perf.bench_merge [--samples 250000] [--datasets 4] [--turns 1]
        [--regenerate last_turn|all_turns|all_turns_rendered] [--prompt-len 20-200]
        [--output-len 200-1800] [--max-length 4096] [--memory-limit-gb G] [--threads N]
        [--repeat 1] [--work /tmp/bench-merge]

The raw data is written as the generate stage leaves it: per dataset, `raw/<d>/part-00000.parquet`
in RAW_SCHEMA with its size and sha256 beside it, every prompt distinct, random token ids, each
turn's output --output-len ids long (uniform) and, with --turns K, K turns per sample, each later
prompt the turn before's prompt and output and a few template ids (as all_turns builds them).
Parts are written a row group (--row-group samples) at a time, so building a billion tokens holds
one row group in memory. The data is kept under --work and reused while its spec is the same.

Then `python -m stages.merge` runs with the command line dvc.yaml gives it, over a params file
naming the datasets (and merge.memory_limit_gb and merge.threads when given), --repeat times:
wall and CPU seconds, merged tokens per wall second, the merge process's peak RSS (its own, from
wait4) and the size of the merged files, one row per run. On a machine shared with other work the
CPU seconds move less than the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from stages.artifacts.raw import RAW_SCHEMA
from stages.runtime.files import atomic_path
from tests.perf.bench_extract import print_table

VOCAB = 150_000  # token ids are drawn below this
TEMPLATE_IDS = 3  # ids the template adds between turns (all_turns)
GB = 1e9


def id_range(text: str) -> tuple[int, int]:
    """`LOW-HIGH` ids (both included), e.g. 200-1800."""
    low, _, high = text.partition("-")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        bounds = (0, -1)
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LOW-HIGH ids, 0 < LOW <= HIGH")
    return bounds


def random_ids(lengths: np.ndarray, rng: np.random.Generator) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    return pa.ListArray.from_arrays(offsets, values)


def concat_rows(*parts: pa.ListArray) -> pa.ListArray:
    """Row i of the result is row i of each part, one after the other."""
    lengths = [pc.list_value_length(p).to_numpy() for p in parts]
    offsets = np.zeros(len(parts[0]) + 1, dtype=np.int32)
    np.cumsum(np.sum(lengths, axis=0), out=offsets[1:])
    values = np.empty(int(offsets[-1]), dtype=np.int32)
    start = offsets[:-1].copy()
    for part, length in zip(parts, lengths, strict=True):
        src = part.offsets.to_numpy()[:-1]
        values[np.repeat(start - src, length) + np.arange(int(length.sum()))] = (
            part.flatten().to_numpy()
        )
        start += length
    return pa.ListArray.from_arrays(offsets, values)


def turn_rows(
    dataset: str, first: int, prompts: pa.ListArray, turn: int, args, rng: np.random.Generator
) -> pa.Table:
    """Turn `turn` of samples first, first + 1, ... given their prompts."""
    count = len(prompts)
    low, high = args.output_len
    outputs = random_ids(rng.integers(low, high + 1, count), rng)
    numbers = range(first, first + count)
    output_len = pc.list_value_length(outputs).cast(pa.int32())
    columns = {
        "sample_id": [f"{dataset}/{n}" for n in numbers],
        "dataset": [dataset] * count,
        "turn": [turn] * count,
        "messages": [
            json.dumps([{"role": "user", "content": f"{dataset} question {n} turn {turn}"}])
            for n in numbers
        ],
        "prompt_ids": prompts,
        "prompt_len": pc.list_value_length(prompts).cast(pa.int32()),
        "reasoning_open": [True] * count,
        "output_ids": outputs,
        "finish_reason": ["stop"] * count,
        "completion_tokens": output_len,
        "answer_tokens": output_len,
        "tool_calls": [0] * count,
        "tool_calls_balanced": [True] * count,
        "latency_s": [1.0] * count,
        "engine": ["bench"] * count,
        "fingerprint": ["bench"] * count,
        "output_text": [""] * count,
        "regenerate": [args.regenerate] * count,
    }
    return pa.table(
        [columns.get(f.name, pa.nulls(count, f.type)) for f in RAW_SCHEMA], schema=RAW_SCHEMA
    )


def write_dataset(directory: Path, dataset: str, samples: int, args, seed: int) -> int:
    """Its one part: `samples` samples x --turns turns, a row group per --row-group samples and
    turn; returns the tokens written (prompt + output of every row)."""
    rng = np.random.default_rng(seed)
    tokens = 0
    with (
        atomic_path(directory / "part-00000.parquet", checksum=True) as tmp,
        pq.ParquetWriter(tmp, RAW_SCHEMA, compression="zstd") as writer,
    ):
        for first in range(0, samples, args.row_group):
            count = min(args.row_group, samples - first)
            low, high = args.prompt_len
            prompts = random_ids(rng.integers(low, high + 1, count), rng)
            for turn in range(1, args.turns + 1):
                rows = turn_rows(dataset, first, prompts, turn, args, rng)
                writer.write_table(rows)
                tokens += pc.sum(rows["prompt_len"]).as_py()
                tokens += pc.sum(rows["completion_tokens"]).as_py()
                template = random_ids(np.full(count, TEMPLATE_IDS), rng)
                prompts = concat_rows(prompts, rows["output_ids"].combine_chunks(), template)
    return tokens


def raw_data(args) -> tuple[list[str], int]:
    """The datasets' names and raw tokens, the data built under --work unless there already."""
    shape = ("samples", "datasets", "turns", "regenerate", "prompt_len", "output_len", "row_group")
    spec = {k: getattr(args, k) for k in shape}
    names = [f"d{i}" for i in range(args.datasets)]
    raw, marker = args.work / "raw", args.work / "raw_spec.json"
    if marker.exists() and json.loads(marker.read_text())["spec"] == json.loads(json.dumps(spec)):
        print(f"[bench-merge] reusing the raw data in {raw}", flush=True)
        return names, json.loads(marker.read_text())["tokens"]
    shutil.rmtree(raw, ignore_errors=True)
    marker.unlink(missing_ok=True)
    start = time.monotonic()
    tokens = 0
    for i, name in enumerate(names):
        share = args.samples // args.datasets + (i < args.samples % args.datasets)
        tokens += write_dataset(raw / name, name, share, args, seed=i)
    marker.write_text(json.dumps({"spec": spec, "tokens": tokens}))
    print(
        f"[bench-merge] wrote {args.samples:,} samples x {args.turns} turns, {tokens:,} tokens "
        f"({dir_bytes(raw) / GB:.2f} GB) in {time.monotonic() - start:.0f} s",
        flush=True,
    )
    return names, tokens


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def write_params(path: Path, names: list[str], args) -> None:
    merge = {"seed": 0, "eval_fraction": 0.05, "max_length": args.max_length}
    if args.memory_limit_gb is not None:
        merge["memory_limit_gb"] = args.memory_limit_gb
    if args.threads is not None:
        merge["threads"] = args.threads
    datasets = {n: {"prep": {"format": "sharegpt", "path": "unused.json"}} for n in names}
    path.write_text(yaml.safe_dump({"merge": merge, "datasets": datasets}))


def run_merge(work: Path, params: Path) -> dict:
    """The merge stage in a child process: wall seconds, its peak RSS, its report."""
    out, report = work / "merged", work / "merge.json"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "stages.merge", "--raw", str(work / "raw"), "--out", str(out)]
    command += ["--report", str(report), "--params", str(params)]
    start = time.monotonic()
    child = subprocess.Popen(command)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        raise SystemExit(f"bench-merge: {' '.join(command)} exited with {child.returncode}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_gb": usage.ru_maxrss * 1024 / GB,  # Linux: KiB
        "output_gb": dir_bytes(out) / GB,
        "report": json.loads(report.read_text()),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=250_000, help="over all datasets")
    parser.add_argument("--datasets", type=int, default=4)
    parser.add_argument("--turns", type=int, default=1, help="turns per sample")
    parser.add_argument(
        "--regenerate",
        choices=["last_turn", "all_turns", "all_turns_rendered"],
        help="the raw rows' mode (default: last_turn for one turn, else all_turns)",
    )
    parser.add_argument("--prompt-len", type=id_range, default=(20, 200), help="first turn's")
    parser.add_argument("--output-len", type=id_range, default=(200, 1800), help="per turn")
    parser.add_argument("--row-group", type=int, default=65_536, help="samples per row group")
    parser.add_argument("--max-length", type=int, default=4096, help="merge.max_length")
    parser.add_argument("--memory-limit-gb", type=float, help="merge.memory_limit_gb")
    parser.add_argument("--threads", type=int, help="merge.threads")
    parser.add_argument("--repeat", type=int, default=1, help="merge runs over the same data")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-merge"))
    args = parser.parse_args(argv)
    args.regenerate = args.regenerate or ("last_turn" if args.turns == 1 else "all_turns")
    args.work.mkdir(parents=True, exist_ok=True)
    names, raw_tokens = raw_data(args)
    params = args.work / "params.yaml"
    write_params(params, names, args)
    runs = [run_merge(args.work, params) for _ in range(args.repeat)]
    columns = ["samples", "raw tokens", "merged tokens", "wall s", "CPU s", "tok/s", "peak RSS GB"]
    columns += ["output GB", "memory limit GB"]
    rows = []
    for r in runs:
        tokens = sum(split["tokens"] for split in r["report"]["summary"].values())
        r["tok_s"] = tokens / r["wall_s"]
        rows.append(
            [
                f"{args.samples:,}",
                f"{raw_tokens:,}",
                f"{tokens:,}",
                f"{r['wall_s']:.1f}",
                f"{r['cpu_s']:.1f}",
                f"{r['tok_s']:,.0f}",
                f"{r['peak_rss_gb']:.2f}",
                f"{r['output_gb']:.2f}",
                "default" if args.memory_limit_gb is None else f"{args.memory_limit_gb:g}",
            ]
        )
    print_table(columns, rows)
    return runs


if __name__ == "__main__":
    main()
