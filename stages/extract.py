"""extract: the target's hidden states for every merged sample, in resumable safetensors shards.

Reads params `target` and `extract`. Writes data/hidden/shard-NNNNN.safetensors (aux [T, 3H],
last [T, H], input_ids [T], loss_mask [T]), data/hidden/index.parquet (sample_id, split, shard,
offset, length) and data/hidden/meta.json (which HF hidden-state indices, and the layer ids that
make SGLang and vLLM capture the same ones). Shards are the unit of resume; under torchrun each
rank extracts the shards with index = rank (mod world size).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import torch

from . import config
from .artifacts import hidden
from .artifacts.hidden import ShardWriter, plan_shards, shard_done, shard_key, shard_rows
from .cli import PathOpt, params_key, run
from .drafter.layers import default_aux_indices
from .runtime import parallel
from .runtime.device import resolve_device
from .runtime.io import Progress, remove_stale_temps, write_json
from .target.features import FeatureBuffers, FeatureExtractor, capture_shard
from .target.model import load_causal_lm
from .target.tokenizer import model_fingerprint

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def extract(
    merged_dir: Path,
    out_dir: Path,
    params: config.ExtractParams,
    target: config.TargetParams,
    rank: int = 0,
    world: int = 1,
) -> dict:
    with params_key("target"):
        model = load_causal_lm(
            target.path, target.device, target.dtype, target.trust_remote_code, target.cpu_threads
        )
    cfg = model.config
    num_layers = cfg.num_hidden_layers
    indices = params.layers or default_aux_indices(num_layers)
    with params_key("extract.layers"):
        extractor = FeatureExtractor(model, indices)
    device = next(model.parameters()).device
    arch = (cfg.architectures or [type(model).__name__])[0]
    fingerprint = hashlib.sha256(
        json.dumps(
            [
                model_fingerprint(target.path, None, [target.dtype]),
                indices,
                params.dtype,
                params.splits,
                params.shard_tokens,
            ]
        ).encode()
    ).hexdigest()[:16]
    meta = {
        "fingerprint": fingerprint,
        "target_path": target.path,
        "architecture": arch,
        "num_hidden_layers": num_layers,
        "hidden_size": cfg.hidden_size,
        "aux_hf_indices": indices,
        "dtype": params.dtype,
        "bytes_per_token": (len(indices) + 1)
        * cfg.hidden_size
        * torch.finfo(DTYPES[params.dtype]).bits
        // 8,
    }
    meta_path = out_dir / hidden.META
    stale = meta_path.exists() and json.loads(meta_path.read_text())["fingerprint"] != fingerprint
    with params_key("extract.splits"):
        plan = plan_shards(merged_dir, params.splits, params.shard_tokens)
    total = sum(r["length"] for s in plan for r in s)
    _barrier(world)  # every rank has read the old meta before rank 0 may remove it
    if rank == 0:
        if stale:
            print("[extract] target, layers or storage settings changed: extracting again")
            shutil.rmtree(out_dir)
        print(
            f"[extract] {total:,} tokens x {meta['bytes_per_token']:,} bytes/token = "
            f"{total * meta['bytes_per_token'] / 2**30:.2f} GiB in {len(plan)} shards "
            f"(layers {indices} of {num_layers})"
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(out_dir)  # before any rank writes: a killed run's half shards
        for old in hidden.shard_files(out_dir):
            if hidden.shard_number(old) >= len(plan):
                old.unlink()
        write_json(meta, meta_path)
    _barrier(world)
    keys = [shard_key(fingerprint, shard) for shard in plan]
    todo = [k for k in range(len(plan)) if not shard_done(hidden.shard_path(out_dir, k), keys[k])]
    mine = [k for k in todo if k % world == rank]
    progress = Progress(
        f"extract rank {rank}",
        sum(len(plan[k]) for k in mine),
        sum(r["length"] for k in mine for r in plan[k]),
    )
    clock = time.monotonic()
    buffers = FeatureBuffers(
        max((sum(r["length"] for r in plan[k]) for k in mine), default=0),
        len(indices) * cfg.hidden_size,
        cfg.hidden_size,
        DTYPES[params.dtype],
        pin=device.type == "cuda",
    )
    with ShardWriter() as writer:  # shard k is written while shard k + world is extracted
        for k, rows in shard_rows(merged_dir, plan, mine):
            tensors = capture_shard(extractor, rows, params.batch_tokens, buffers, device)
            tensors["loss_mask"] = hidden.loss_mask(rows)
            writer.put(tensors, hidden.shard_path(out_dir, k), {"shard_key": keys[k]})
            progress.update(len(rows), int(tensors["input_ids"].numel()))
    _barrier(world)
    seconds = time.monotonic() - clock  # the slowest rank's time: what the run waited for
    extracted = sum(r["length"] for k in todo for r in plan[k])
    samples = sum(len(shard) for shard in plan)
    if rank == 0:
        hidden.write_index(out_dir, plan)
    return {
        "tokens": total,
        "shards": len(plan),
        "samples": samples,
        "bytes": total * meta["bytes_per_token"],
        "aux_hf_indices": indices,
        "world_size": world,
        "extracted_tokens": extracted,
        "tokens_per_s": round(extracted / seconds, 1) if extracted else 0.0,
    }


def _barrier(world: int) -> None:
    if world > 1:
        torch.distributed.barrier()


def main(merged: PathOpt, out: PathOpt, report: PathOpt, params: Path = config.PARAMS_FILE) -> None:
    """Extract target hidden states (run under torchrun for several GPUs)."""
    ext = config.section(config.ExtractParams, "extract", params)
    target = config.section(config.TargetParams, "target", params)
    rank, device = parallel.start(resolve_device(target.device))
    target = config.TargetParams(**{**target.__dict__, "device": str(device)})
    metrics = extract(merged, out, ext, target, rank.rank, rank.world)
    if rank.main:
        write_json(metrics, report)
        print(f"[extract] {metrics}")
    parallel.stop(rank)


if __name__ == "__main__":
    run(main)
