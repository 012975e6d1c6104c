"""What the stages that train a drafter (train: EAGLE-3, train_dflash: DFlash) share around the
library's loop (stages/drafter/training.py): its settings from a section's keys, what the
checkpoints belong to and the run's start and end around them, the process's threads and seed,
the verified splits, the outputs guarded while the run writes them, the target's config and the
rope its SGLang release serves, and the best checkpoint to export."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoConfig

from ..artifacts import hidden
from ..artifacts.hidden import HiddenStates
from ..cli import StageError, params_key
from ..drafter.checkpoints import EARLIER, start_or_resume
from ..drafter.layers import parse_version
from ..drafter.model import rope_serving_problem
from ..drafter.training import History, TrainingSettings
from ..params.drafting import DrafterKeys
from ..params.target import TargetParams
from ..runtime import parallel
from ..runtime.device import set_cpu_threads
from ..runtime.fields import speed_only_keys
from ..runtime.files import ChecksumError, verify_checksum
from ..runtime.outputs import output_lock, remove_stale_temps_around
from ..runtime.swap import drop_aside

S = TypeVar("S", bound=TrainingSettings)


def loop_settings(p: DrafterKeys, train_samples: int, kind: type[S]) -> S:
    """The loop's settings (`kind`: TrainingSettings, or a subclass carrying its objective's
    knobs): the knobs as params set them, and the steps derived from the section's keys."""
    steps_per_epoch = math.ceil(train_samples / p.batch_size)
    total = p.max_steps or max(1, math.ceil(steps_per_epoch * p.epochs))
    knobs = {f.name: getattr(p, f.name) for f in dataclasses.fields(kind) if not f.kw_only}
    return kind(
        **knobs,
        total_steps=total,
        warmup_steps=max(1, int(total * p.warmup_ratio)),
        compile=p.compile is not False,
        section=p.KEY,
    )


def checkpoint_identity(p: Any, features: str) -> dict:
    """What a section's checkpoints belong to: its params that change the drafter (all but the
    speed-only ones), under the section's key, and the features' fingerprint."""
    speed_only = speed_only_keys(type(p))
    return {
        p.KEY: {k: v for k, v in p.__dict__.items() if k not in speed_only},
        "hidden": features,
    }


def prepare(p: DrafterKeys, key: str, rank: parallel.Rank, device: torch.device) -> None:
    """The process's threads and seed, and a batch that splits over the ranks (`key`: the
    section, for the error)."""
    if device.type == "cpu":
        set_cpu_threads(p.cpu_threads)
    if p.batch_size % rank.world:
        raise StageError(
            f"{key}.batch_size: {p.batch_size} samples do not split evenly over "
            f"{rank.world} processes; use a multiple of {rank.world}"
        )
    torch.manual_seed(p.seed)


def family_layers(meta: hidden.HiddenMeta, family: str, hidden_dir: Path) -> list[int]:
    """The HF indices `family` reads of the stored features, or an error naming the fix."""
    layers = meta.layers_for(family)
    if layers is None:
        raise StageError(
            f"{hidden_dir / hidden.META}: the features were not captured for {family}; add "
            f"{family} to extract.drafters and rerun extract"
        )
    return layers


def features_identity(meta: hidden.HiddenMeta, layers: list[int]) -> str:
    """What a drafter's checkpoints were trained on: the features' fingerprint and, when the
    drafter reads only some of the captured layers, which (a run that read them all keeps the
    identity it had before families were recorded)."""
    if list(layers) == list(meta.aux_hf_indices):
        return meta.fingerprint
    return f"{meta.fingerprint} layers {list(layers)}"


ONLINE = ", features from the target on each batch (extract.store none)"  # the run's first line
STORED = "stored"  # the reports' `features` of a run that read extracted shards


def features_origin(meta: hidden.HiddenMeta) -> str:
    """The reports' `features`: STORED, or "online <engine>" when extract stored none and the
    target runs on each batch."""
    return f"online {meta.engine or 'hf'}" if meta.store == "none" else STORED


def feature_source(history: History, features_from: str) -> dict[str, Any]:
    """Where a run's features came from (STORED, or "online <engine>") and, online, the share of
    the step time the target's forward took: what both training reports keep of it."""
    online = features_from != STORED
    return {
        "features": features_from,
        "target_forward_share": round(history.target_share, 4) if online else None,
    }


def verified_splits(
    hidden_dir: Path, max_length: int, rank: parallel.Rank, layers: list[int]
) -> tuple[HiddenStates, HiddenStates]:
    """The train and eval splits, their aux holding `layers` (HF indices), every shard checked
    to be the file extract wrote (size and sha256) before a step uses it; each rank reads its
    share once."""
    train_set = HiddenStates(hidden_dir, "train", max_length, layers)
    eval_set = HiddenStates(hidden_dir, "eval", max_length, layers)
    if not len(train_set):
        raise StageError(f"{hidden_dir / hidden.INDEX}: no train samples; check extract.splits")
    shards = sorted({r["shard"] for r in train_set.rows + eval_set.rows})
    hidden.verify_shards(hidden_dir, shards[rank.rank :: rank.world])
    return train_set, eval_set


@contextlib.contextmanager
def guarded_outputs(
    stage: str, rank: parallel.Rank, checkpoint_dir: Path, *outputs: Path
) -> Iterator[None]:
    """Rank 0 holds the checkpoint folder's lock for the whole run (a second training writing the
    same checkpoints is refused) and first removes what a killed run left half-written beside
    `outputs`; a damaged shard or checkpoint is named with its fix."""
    with (
        output_lock(checkpoint_dir, stage) if rank.main else contextlib.nullcontext(),
        parallel.collective_failures_named(rank),
    ):
        if rank.main:
            remove_stale_temps_around(checkpoint_dir, *outputs)
        try:
            yield
        except ChecksumError as err:
            raise StageError(
                f"{err}; a shard: rerun extract (it extracts a damaged shard again); a "
                f"checkpoint: delete it to train from the start, or restore it"
            ) from None


def best_checkpoint(checkpoint_dir: Path) -> dict:
    """The best checkpoint's contents (the last when there was nothing to evaluate), checked
    against its recorded size and sha256: what the stage exports, not the drafter as training
    left it."""
    best_path = checkpoint_dir / "best.pt"
    chosen = best_path if best_path.exists() else checkpoint_dir / "last.pt"
    verify_checksum(chosen)
    return torch.load(chosen, map_location="cpu", weights_only=True)


def serving_target(target: TargetParams) -> Any:
    """The target's config, which a drafter mirrors and its export is checked against."""
    return AutoConfig.from_pretrained(
        target.path, local_files_only=True, trust_remote_code=target.trust_remote_code
    )


def refuse_unservable_rope(rope_scaling: dict | None, sglang_version: str | None, key: str) -> None:
    """A draft whose rope scaling the SGLang release it is for (`key`.sglang_version) could not
    serve is refused before any training."""
    with params_key(f"{key}.sglang_version"):
        version = parse_version(sglang_version) if sglang_version else None
    if problem := rope_serving_problem(rope_scaling, version):
        raise StageError(f"{key}.draft / {key}.sglang_version: {problem}")


def start_run(stage: str, checkpoint_dir: Path, identity: dict, rank: parallel.Rank) -> None:
    """Rank 0 keeps the checkpoints that belong to this run (`identity`) and puts any other
    run's aside; the other ranks wait for it."""
    if rank.main:
        start_or_resume(checkpoint_dir, identity, stage)
    if rank.world > 1:
        torch.distributed.barrier()


def complete_run(checkpoint_dir: Path) -> None:
    """The run has exported and reported: the earlier run's checkpoints kept aside go."""
    drop_aside(checkpoint_dir, checkpoint_dir / EARLIER)
