"""extract: the target's hidden states for every merged sample, in resumable safetensors shards.

Reads params `target` and `extract`. Writes data/hidden/shard-NNNNN.safetensors (aux [T, 3H],
last [T, H], input_ids [T], loss_mask [T]), data/hidden/index.parquet (sample_id, split, shard,
offset, length) and data/hidden/meta.json (which HF hidden-state indices, and the layer ids that
make SGLang and vLLM capture the same ones). Shards are the unit of resume. `extract.store`
(stages/artifacts/hidden.py) keeps only what the loss reads (`supervised`), or no features at all
(`none`: no target is loaded here, the train stage runs it).

The engine (`extract.engine`) is behind one interface, stages/target/capture.py `Capture`:
`hf` loads the whole target in every process and, under torchrun, each rank extracts every
world-size-th shard of those left (in a fresh run: index = rank mod world size); `sglang` runs
SGLang's model runner tensor parallel over all ranks (torchrun --nproc-per-node
extract.sglang.tp_size), every rank runs every forward and rank 0 alone writes. Before the run:
the storage, the host buffers, and the hours projected from one timed batch.

The loop keeps the device busy: features are copied out while the next forwards run, and
`extract.writers` threads write, hash and fsync shards beside it (ShardCapture,
ShardWriter). reports/extract.json's tokens_per_s is that loop's, after the warm-up
(`warmup_s`: the first forwards, compilation with extract.compile); `time` says where it went.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import config
from .artifacts import hidden
from .artifacts.hidden import (
    ShardWriter,
    WriteTimes,
    plan_shards,
    shard_key,
    shard_problem,
    shard_rows,
)
from .capture.buffers import FeatureBuffers
from .capture.interface import Capture
from .capture.shards import CaptureTimes, ShardCapture, leading_rows, timed_rate
from .cli import PathOpt, params_key, run, summary
from .runtime import parallel
from .runtime.device import resolve_device
from .runtime.files import remove_with_checksum, write_json
from .runtime.outputs import empty_dir, output_lock, remove_stale_temps, remove_stale_temps_around
from .runtime.progress import Progress
from .target.tokenizer import model_fingerprint
from .wiring.capture import DTYPES, build_capture, config_only_facts


def forward_tokens(params: config.ExtractParams) -> int:
    """Tokens one forward of the configured engine holds: the size of the timed batch."""
    if params.engine == "sglang":
        return params.sglang.max_tokens_per_forward
    return params.batch_tokens


def extract(
    merged_dir: Path,
    out_dir: Path,
    params: config.ExtractParams,
    target: config.TargetParams,
    rank: int = 0,
    world: int = 1,
) -> dict:
    """Extract into `out_dir`, whose lock rank 0 holds throughout (a second extraction into the
    same folder is refused)."""
    lock = output_lock(out_dir, "extract") if rank == 0 else contextlib.nullcontext()
    with lock:
        return _extract(merged_dir, out_dir, params, target, rank, world)


def _extract(
    merged_dir: Path,
    out_dir: Path,
    params: config.ExtractParams,
    target: config.TargetParams,
    rank: int,
    world: int,
) -> dict:
    # store none keeps no features: no target is loaded, its facts come from its config.json
    capture = build_capture(params, target, rank, world) if params.store != "none" else None
    facts = capture if capture is not None else config_only_facts(params, target, rank, world)
    role = facts.role
    indices = facts.aux_indices
    num_layers, hidden_size = facts.num_layers, facts.hidden_size
    engine_key = [] if params.engine == "hf" else [params.engine]  # hf keeps its old shard keys
    store_key = [] if params.store == "all" else [f"store={params.store}"]  # so does all
    fingerprint = hashlib.sha256(
        json.dumps(
            [
                model_fingerprint(target.path, None, [target.dtype]),
                indices,
                params.dtype,
                params.splits,
                params.shard_tokens,
                *engine_key,
                *store_key,
            ]
        ).encode()
    ).hexdigest()[:16]
    with params_key("extract.splits"):
        plan = plan_shards(merged_dir, params.splits, params.shard_tokens, params.store)
    total = sum(r["tokens"] for s in plan for r in s)
    size = hidden.storage(
        plan, len(indices) * hidden_size, hidden_size, DTYPES[params.dtype].itemsize, params.store
    )
    meta = hidden.HiddenMeta(
        fingerprint=fingerprint,
        target_path=target.path,
        architecture=facts.architecture,
        num_hidden_layers=num_layers,
        hidden_size=hidden_size,
        aux_hf_indices=indices,
        dtype=params.dtype,
        bytes_per_token=size["bytes_per_token"],
        **_engine_meta(params.engine, capture),
        **({} if params.store == "all" else {k: size[k] for k in ("store", "bytes_per_token_all")}),
    )
    meta_path = out_dir / hidden.META
    stale = meta_path.exists() and hidden.read_meta(out_dir).fingerprint != fingerprint
    _barrier(world)  # every rank has read the old meta before rank 0 may remove it
    if rank == 0:
        if stale:
            print("[extract] target, layers or storage settings changed: extracting again")
            empty_dir(out_dir)
        print(
            f"[extract] {total:,} tokens x {meta.bytes_per_token:,} bytes/token = "
            f"{size['bytes'] / 2**30:.2f} GiB in {len(plan)} shards (store {params.store}, "
            f"all: {size['bytes_per_token_all']:,} bytes/token; layers {indices} of "
            f"{num_layers}, engine {params.engine})"
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out_dir)  # before any rank writes: a killed run's half shards
        for old in hidden.shard_files(out_dir):
            if hidden.shard_number(old) >= len(plan):
                remove_with_checksum(old)
        write_json(meta.to_json(), meta_path)
    _barrier(world)
    keys = [shard_key(fingerprint, shard) for shard in plan]
    problems = shard_problems(out_dir, keys, rank, world)
    todo = sorted(problems)
    if rank == 0:
        for k, problem in sorted(problems.items()):
            if problem != "missing":
                print(f"[extract] {hidden.shard_path(out_dir, k)}: {problem}; extracting it again")
    _barrier(world)  # every rank has its list before a shard is written: TP ranks must agree
    # every groups-th shard of those left: a rerun after a rank died splits its shards over all
    # groups instead of leaving them to one while the others wait at the last barrier
    mine = todo[role.group :: role.groups]
    left = sum(r["length"] for k in todo for r in plan[k])
    buffer_tokens = max((sum(r["length"] for r in plan[k]) for k in mine), default=0)
    row_bytes = size["bytes_per_token_all"] if capture is not None else 0  # whole rows
    sets = params.writers + 2  # one set per write in flight, one filling, one landing
    if rank == 0:
        print(
            f"[extract] host memory: {sets} x {buffer_tokens:,} tokens x {row_bytes:,} bytes = "
            f"{sets * buffer_tokens * row_bytes / 2**30:.2f} GiB per writing process"
        )
    device = resolve_device(target.device)
    buffers = (  # allocated on a thread of their own, beside the warm-up and the first shards
        FeatureBuffers(
            buffer_tokens,
            len(indices) * hidden_size,
            hidden_size,
            DTYPES[params.dtype],
            pin=device.type == "cuda",
            sets=sets,
        )
        if role.writes and capture is not None
        else None
    )
    warmup_s = 0.0
    if mine and capture is not None:
        _, first = next(shard_rows(merged_dir, plan, mine[:1]))
        timed = leading_rows(first, forward_tokens(params))
        warmup_s, rate = timed_rate(capture, [r["input_ids"] for r in timed])
        if rank == 0:
            eta_s = left / max(rate * role.groups, 1e-9)
            print(
                f"[extract] timed {sum(len(r['input_ids']) for r in timed):,} tokens: "
                f"{rate:,.0f} tokens/s x {role.groups} capture group(s); {left:,} tokens to "
                f"extract: about {eta_s / 3600:.2f} hours ({eta_s:,.0f} s)"
            )
    progress = Progress(
        f"extract rank {rank}",
        sum(len(plan[k]) for k in mine),
        sum(r["length"] for k in mine for r in plan[k]),
    )
    capturing = ShardCapture(capture, buffers, device)
    clock = time.monotonic()  # after the warm-up: tokens/s is the steady rate
    with ShardWriter(params.writers) as writer:  # shards are written while the next extract
        for k, rows, features in capturing.shards(shard_rows(merged_dir, plan, mine)):
            if role.writes:
                tensors = hidden.shard_tensors(features, rows, params.store)
                writer.put(tensors, hidden.shard_path(out_dir, k), {"shard_key": keys[k]})
                progress.update(len(rows), int(tensors["input_ids"].numel()))
        landed = time.monotonic()
    last_writes_s = time.monotonic() - landed
    buffers_s = buffers.allocation_s() if buffers is not None else 0.0
    _barrier(world)
    seconds = time.monotonic() - clock  # the slowest rank's time: what the run waited for
    samples = sum(len(shard) for shard in plan)
    if rank == 0:
        hidden.write_index(out_dir, plan, params.store)
    return {
        "tokens": total,
        "shards": len(plan),
        "samples": samples,
        **size,
        "aux_hf_indices": indices,
        "world_size": world,
        "engine": params.engine,
        "extracted_tokens": left,
        "tokens_per_s": round(left / seconds, 1) if left else 0.0,
        "warmup_s": round(warmup_s, 3),  # rank 0's: the first forwards, compilation included
        "time": _time_report(seconds, buffers_s, last_writes_s, capturing.times, writer.times),
    }


def shard_problems(out_dir: Path, keys: list[str], rank: int, world: int) -> dict[int, str]:
    """{shard: why it must be extracted} over the plan. Checking a shard reads it whole (its
    sha256), so each rank checks the shards k % world == rank and the ranks share the results."""
    mine = {
        k: problem
        for k in range(rank, len(keys), world)
        if (problem := shard_problem(hidden.shard_path(out_dir, k), keys[k]))
    }
    if world == 1:
        return mine
    gathered: list[dict[int, str]] = [{} for _ in range(world)]
    torch.distributed.all_gather_object(gathered, mine)
    return {k: v for part in gathered for k, v in part.items()}


def _time_report(
    seconds: float,
    buffers_s: float,
    last_writes_s: float,
    capture: CaptureTimes,
    writes: WriteTimes,
) -> dict:
    """Where rank 0's extraction loop (tokens_per_s's) spent its seconds: the device's forwards
    and copies out, the host waiting for copies to land, for host buffers still being allocated
    (beside the warm-up and the first shards) and for a free writer, the writes still running
    once the last features landed (the loop's end, about one shard's write whatever the run's
    length), and the writers' own busy time (summed over the threads, beside the loop); and
    `buffers_s`, the host buffers' allocation on its own thread, beside the warm-up."""
    times = {
        "buffers_s": buffers_s,
        "loop_s": seconds,
        "last_writes_s": last_writes_s,
        **asdict(capture),
        **asdict(writes),
    }
    return {k: round(v, 3) for k, v in times.items()}


def _engine_meta(engine: str, capture: Capture | None) -> dict:
    """What an engine other than hf adds to meta.json: its name, and for sglang its version and
    the layer ids it captured with."""
    if engine == "hf":
        return {}
    version, ids = getattr(capture, "version", None), getattr(capture, "layer_ids", None)
    extra = {"sglang_version": version, "sglang_capture_ids": list(ids)} if ids else {}
    return {"engine": engine, **extra}


def _barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()


def main(merged: PathOpt, out: PathOpt, report: PathOpt, params: Path = config.PARAMS_FILE) -> None:
    """Extract target hidden states (run under torchrun for several GPUs)."""
    ext = config.section(config.ExtractParams, "extract", params)
    target = config.section(config.TargetParams, "target", params)
    rank, device = parallel.start(resolve_device(target.device))
    target = config.TargetParams(**{**target.__dict__, "device": str(device)})
    if rank.main:
        remove_stale_temps_around(report)  # the folder `out` is cleaned by extract() itself
    with parallel.collective_failures_named(rank):
        metrics = extract(merged, out, ext, target, rank.rank, rank.world)
    if rank.main:
        write_json(metrics, report)
        print(summary("extract", metrics))
    parallel.stop(rank)


if __name__ == "__main__":
    run(main)
