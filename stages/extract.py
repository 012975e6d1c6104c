"""extract: the target's hidden states for every merged sample, in resumable safetensors shards.

Reads params `target`, `extract` and, when extract.drafters names DFlash, the layers `dflash`
reads. Captures the union of the layers of every family in extract.drafters, once. Writes
data/hidden/shard-NNNNN.safetensors (aux [T, layers x H], last [T, H], input_ids [T], loss_mask
[T]), data/hidden/index.parquet (sample_id, split, shard, offset, length) and
data/hidden/meta.json (which HF hidden-state indices, which of them each family reads, and the
layer ids that make SGLang and vLLM capture the same ones). Shards are the unit of resume.
`extract.store` (stages/artifacts/hidden.py) keeps only what the loss reads (`supervised`), or
no features at all (`none`: no target is loaded here, the train stages run it).

The engine (`extract.engine`) is behind one interface, stages/capture/interface.py `Capture`:
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
import dataclasses
import hashlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

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
from .capture.interface import Capture, config_facts
from .capture.shards import CaptureTimes, ShardCapture, leading_rows, timed_rate
from .cli import PathOpt, params_key, run, summary
from .params.dflash import DFlashParams
from .params.extract import ExtractParams
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .reports.extract import ExtractReport, layer_costs
from .runtime import parallel
from .runtime.device import resolve_device
from .runtime.files import remove_with_checksum, write_json
from .runtime.outputs import output_lock, remove_stale_temps, remove_stale_temps_around
from .runtime.progress import Progress
from .target_model.tokenizer import model_fingerprint
from .wiring.capture import DTYPES, ConfigFacts, build_capture, config_only_facts
from .wiring.feature_layers import captured_layers, drafter_layers


def forward_tokens(params: ExtractParams) -> int:
    """Tokens one forward of the configured engine holds: the size of the timed batch."""
    if params.engine == "sglang":
        return params.sglang.max_tokens_per_forward
    return params.batch_tokens


def extract(
    merged_dir: Path,
    out_dir: Path,
    params: ExtractParams,
    target: TargetParams,
    rank: int = 0,
    world: int = 1,
    dflash: DFlashParams | None = None,
) -> ExtractReport:
    """Extract into `out_dir`, whose lock rank 0 holds throughout (a second extraction into the
    same folder is refused). `dflash`: the DFlash section, whose layers are captured too when
    extract.drafters names it (None: its defaults)."""
    with params_key("target"):
        num_layers = config_facts(target.path)[1]
    layers = drafter_layers(params, dflash or DFlashParams(), num_layers)
    lock = output_lock(out_dir, "extract") if rank == 0 else contextlib.nullcontext()
    with lock:
        return _extract(merged_dir, out_dir, params, target, rank, world, layers)


def _extract(
    merged_dir: Path,
    out_dir: Path,
    params: ExtractParams,
    target: TargetParams,
    rank: int,
    world: int,
    layers: dict[str, list[int]],
) -> ExtractReport:
    """The stage as the steps every rank takes together (barriers inside them): the plan, the
    folder made to match it, the shards left shared out, a timed warm-up, the loop, the index.
    `layers`: what each drafter family reads; the union is captured, once."""
    params = dataclasses.replace(params, layers=captured_layers(layers))
    # store none keeps no features: no target is loaded, its facts come from its config.json
    capture = build_capture(params, target, rank, world) if params.store != "none" else None
    facts = capture if capture is not None else config_only_facts(params, target, rank, world)
    role = facts.role
    fingerprint, shaped_by = _fingerprint(out_dir, params, target, facts.aux_indices)
    with params_key("extract.splits"):
        plan = plan_shards(merged_dir, params.splits, params.shard_tokens, params.store)
    total = sum(r["tokens"] for s in plan for r in s)
    width = len(facts.aux_indices) * facts.hidden_size
    size = hidden.storage(
        plan, width, facts.hidden_size, DTYPES[params.dtype].itemsize, params.store
    )
    meta = _meta(fingerprint, shaped_by, params, target, facts, capture, size, layers)
    storage_line = _storage_line(total, size, len(plan), meta, params)
    _prepare_out_dir(out_dir, meta, storage_line, rank, world)
    shards = _Shards(merged_dir, out_dir, plan, [shard_key(fingerprint, shard) for shard in plan])
    todo = _shards_to_extract(shards, rank, world)
    # every groups-th shard of those left: a rerun after a rank died splits its shards over all
    # groups instead of leaving them to one while the others wait at the last barrier
    mine = todo[role.group :: role.groups]
    left = shards.tokens(todo)
    device = resolve_device(target.device)
    buffers = _host_buffers(shards, mine, size, capture, params, device, rank)
    warmup_s = _timed_warmup(shards, mine, capture, params, left, role.groups, rank)
    seconds, times = _capture_and_write(
        shards, mine, capture, buffers, device, params, role.writes, rank, world
    )
    if rank == 0:
        hidden.write_index(out_dir, plan, params.store)
        for old in hidden.shard_files(out_dir):  # an earlier, longer plan's: the run is done
            if hidden.shard_number(old) >= len(plan):
                remove_with_checksum(old)
    return ExtractReport(
        tokens=total,
        shards=len(plan),
        samples=sum(len(shard) for shard in plan),
        **size,
        aux_hf_indices=facts.aux_indices,
        drafters=layer_costs(layers, facts.hidden_size, DTYPES[params.dtype].itemsize),
        world_size=world,
        engine=params.engine,
        extracted_tokens=left,
        tokens_per_s=round(left / seconds, 1) if left else 0.0,
        warmup_s=round(warmup_s, 3),  # rank 0's: the first forwards, compilation included
        time=times,
    )


@dataclass(frozen=True)
class _Shards:
    """The plan, the folders its shards are read from and written to and the key each is written
    under: what every step after the planning needs, passed as one."""

    merged_dir: Path
    out_dir: Path
    plan: list[list[dict]]
    keys: list[str]  # shard_key of each: a shard on disk under another one is extracted again

    def rows(self, wanted: list[int]) -> Iterator[tuple[int, list[dict]]]:
        """Streamed from the files the plan was made from, one shard in memory at a time."""
        return shard_rows(self.merged_dir, self.plan, wanted)

    def tokens(self, wanted: Iterable[int]) -> int:
        """Rows stored, not merged tokens: what sizes the buffers, the progress and the ETA."""
        return sum(r["length"] for k in wanted for r in self.plan[k])


def _fingerprint(
    out_dir: Path, params: ExtractParams, target: TargetParams, indices: list[int]
) -> tuple[str, dict]:
    """The key the shards are written under (hidden.shard_key) and the facts that shape them
    (a change extracts again). The earlier run's key is kept when its meta.json records these
    facts, whatever formula hashed them, or, written before the facts were recorded, holds the key
    that time's formula gives for them (_legacy_fingerprint): an upgrade extracts nothing again."""
    facts = {
        "model_files": model_fingerprint(target.path, None, None),
        "target_dtype": target.dtype,
        "layers": indices,
        "dtype": params.dtype,
        "splits": params.splits,
        "shard_tokens": params.shard_tokens,
        "engine": params.engine,
        "store": params.store,
    }
    facts = json.loads(json.dumps(facts, sort_keys=True))  # as meta.json holds them
    if (out_dir / hidden.META).exists():
        earlier = hidden.read_meta(out_dir)
        recorded = earlier.extracted_by
        if recorded == facts or (
            recorded is None and earlier.fingerprint == _legacy_fingerprint(params, target, indices)
        ):
            return earlier.fingerprint, facts
    return _facts_key(facts), facts


def _facts_key(facts: dict) -> str:
    """A new extraction's key: a hash of its facts."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _legacy_fingerprint(params: ExtractParams, target: TargetParams, indices: list[int]) -> str:
    """The key of the stage before meta.json recorded its facts (extracted_by): the shards of
    a folder whose meta.json has none are kept when its fingerprint equals this. Keep it as it
    is. The hf engine and store all add nothing: shards from before those settings matched."""
    engine_key = [] if params.engine == "hf" else [params.engine]
    store_key = [] if params.store == "all" else [f"store={params.store}"]
    return hashlib.sha256(
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


def _meta(
    fingerprint: str,
    shaped_by: dict,
    params: ExtractParams,
    target: TargetParams,
    facts: Capture | ConfigFacts,
    capture: Capture | None,
    size: dict,
    layers: dict[str, list[int]],
) -> hidden.HiddenMeta:
    """meta.json as this run writes it: what train reads of the target and the storage, and the
    fingerprint and facts a rerun compares to know whether the folder is still this run's."""
    return hidden.HiddenMeta(
        fingerprint=fingerprint,
        extracted_by=shaped_by,
        target_path=target.path,
        architecture=facts.architecture,
        num_hidden_layers=facts.num_layers,
        hidden_size=facts.hidden_size,
        aux_hf_indices=facts.aux_indices,
        dtype=params.dtype,
        bytes_per_token=size["bytes_per_token"],
        drafter_layers=layers,
        **_engine_meta(params.engine, capture),
        **({} if params.store == "all" else {k: size[k] for k in ("store", "bytes_per_token_all")}),
    )


def _storage_line(
    total: int, size: dict, shards: int, meta: hidden.HiddenMeta, params: ExtractParams
) -> str:
    """Rank 0's line on what the run stores, so the disk it takes is known before it is taken."""
    return (
        f"[extract] {total:,} tokens x {meta.bytes_per_token:,} bytes/token = "
        f"{size['bytes'] / 2**30:.2f} GiB in {shards} shards (store {params.store}, "
        f"all: {size['bytes_per_token_all']:,} bytes/token; layers {meta.aux_hf_indices} of "
        f"{meta.num_hidden_layers}: {_families(meta.drafter_layers or {})}; engine "
        f"{params.engine})"
    )


def _families(layers: dict[str, list[int]]) -> str:
    """Which layers each family reads, for the storage line."""
    return ", ".join(f"{family} {read}" for family, read in layers.items())


def _prepare_out_dir(
    out_dir: Path, meta: hidden.HiddenMeta, storage_line: str, rank: int, world: int
) -> None:
    """Rank 0 makes the folder this run's before any rank writes: rid of a killed run's half
    shards, with this run's meta.json. When the fingerprint changed nothing else goes: each
    earlier shard is replaced when this run's shard of its number lands (its key tells them
    apart), and those past the plan's end once the run is done, so a run that fails keeps what it
    has not replaced. Every rank reads the old meta first, and waits until the folder is ready."""
    meta_path = out_dir / hidden.META
    stale = meta_path.exists() and hidden.read_meta(out_dir).fingerprint != meta.fingerprint
    _barrier(world)  # every rank has read the old meta before rank 0 may remove it
    if rank == 0:
        if stale:
            print(
                "[extract] target, layers or storage settings changed: extracting again, each "
                "earlier shard kept until this run's shard of its number replaces it"
            )
        print(storage_line)
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out_dir)  # before any rank writes: a killed run's half shards
        write_json(meta.to_json(), meta_path)
    _barrier(world)


def _shards_to_extract(shards: _Shards, rank: int, world: int) -> list[int]:
    """The shards not on disk whole under this run's keys, in order and the same on every rank
    before any shard is written (TP ranks must agree); rank 0 says why each one on disk is
    extracted again."""
    problems = shard_problems(shards.out_dir, shards.keys, rank, world)
    todo = sorted(problems)
    if rank == 0:
        for k, problem in sorted(problems.items()):
            if problem != "missing":
                path = hidden.shard_path(shards.out_dir, k)
                print(f"[extract] {path}: {problem}; extracting it again")
    _barrier(world)  # every rank has its list before a shard is written: TP ranks must agree
    return todo


def _host_buffers(
    shards: _Shards,
    mine: list[int],
    size: dict,
    capture: Capture | None,
    params: ExtractParams,
    device: torch.device,
    rank: int,
) -> FeatureBuffers | None:
    """Host memory for the features of this process's largest shard, said by rank 0 before it is
    taken: pinned, it can be the run's largest. None where nothing is kept (store none, a
    tensor-parallel rank that does not write)."""
    tokens = max((shards.tokens([k]) for k in mine), default=0)
    row_bytes = size["bytes_per_token_all"] if capture is not None else 0  # whole rows
    sets = params.writers + 2  # one set per write in flight, one filling, one landing
    if rank == 0:
        print(
            f"[extract] host memory: {sets} x {tokens:,} tokens x {row_bytes:,} bytes = "
            f"{sets * tokens * row_bytes / 2**30:.2f} GiB per writing process"
        )
    if capture is None or not capture.role.writes:
        return None
    # allocated on a thread of their own, beside the warm-up and the first shards
    return FeatureBuffers(
        tokens,
        len(capture.aux_indices) * capture.hidden_size,
        capture.hidden_size,
        DTYPES[params.dtype],
        pin=device.type == "cuda",
        sets=sets,
    )


def _timed_warmup(
    shards: _Shards,
    mine: list[int],
    capture: Capture | None,
    params: ExtractParams,
    left: int,
    groups: int,
    rank: int,
) -> float:
    """A warm-up on this process's first shard (CUDA start-up, compilation), then one timed
    batch: rank 0 projects the hours left before they are spent, and the loop's rate leaves the
    warm-up out. Returns the warm-up's seconds, 0 with no shard or no capture to warm up."""
    if not mine or capture is None:
        return 0.0
    _, rows = next(shards.rows(mine[:1]))
    timed = leading_rows(rows, forward_tokens(params))
    warmup_s, rate = timed_rate(capture, [r["input_ids"] for r in timed])
    if rank == 0:
        eta_s = left / max(rate * groups, 1e-9)
        print(
            f"[extract] timed {sum(len(r['input_ids']) for r in timed):,} tokens: "
            f"{rate:,.0f} tokens/s x {groups} capture group(s); {left:,} tokens to "
            f"extract: about {eta_s / 3600:.2f} hours ({eta_s:,.0f} s)"
        )
    return warmup_s


def _capture_and_write(
    shards: _Shards,
    mine: list[int],
    capture: Capture | None,
    buffers: FeatureBuffers | None,
    device: torch.device,
    params: ExtractParams,
    writes: bool,
    rank: int,
    world: int,
) -> tuple[float, dict]:
    """The loop tokens_per_s measures, from after the warm-up until the slowest rank is done
    (what the run waited for): the device captures the next shards while the writer threads
    write the last. Returns its seconds and where they went."""
    progress = Progress(
        f"extract rank {rank}", sum(len(shards.plan[k]) for k in mine), shards.tokens(mine)
    )
    capturing = ShardCapture(capture, buffers, device)
    clock = time.monotonic()  # after the warm-up: tokens/s is the steady rate
    with ShardWriter(params.writers) as writer:  # shards are written while the next extract
        for k, rows, features in capturing.shards(shards.rows(mine)):
            if writes:
                tensors = hidden.shard_tensors(features, rows, params.store)
                writer.put(
                    tensors, hidden.shard_path(shards.out_dir, k), {"shard_key": shards.keys[k]}
                )
                progress.update(len(rows), int(tensors["input_ids"].numel()))
        landed = time.monotonic()
    last_writes_s = time.monotonic() - landed
    buffers_s = buffers.allocation_s() if buffers is not None else 0.0
    _barrier(world)
    seconds = time.monotonic() - clock  # the slowest rank's time: what the run waited for
    return seconds, _time_report(seconds, buffers_s, last_writes_s, capturing.times, writer.times)


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


def main(merged: PathOpt, out: PathOpt, report: PathOpt, params: Path = PARAMS_FILE) -> None:
    """Extract target hidden states (run under torchrun for several GPUs)."""
    ext = ExtractParams.read(params)
    target = TargetParams.read(params)
    dflash = DFlashParams.read(params)  # the layers DFlash reads, when extract.drafters names it
    rank, device = parallel.start(resolve_device(target.device))
    target = TargetParams(**{**target.__dict__, "device": str(device)})
    if rank.main:
        remove_stale_temps_around(report)  # the folder `out` is cleaned by extract() itself
    with parallel.collective_failures_named(rank):
        metrics = extract(merged, out, ext, target, rank.rank, rank.world, dflash)
    if rank.main:
        metrics.write(report)
        print(summary("extract", metrics.to_json()))
    parallel.stop()


if __name__ == "__main__":
    run(main)
