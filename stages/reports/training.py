"""What every training stage's report keeps of how its run went (reports/train.json for
EAGLE-3, reports/train_dflash.json for DFlash): one loop trains both."""

from __future__ import annotations

from dataclasses import dataclass

from .record import Report


@dataclass(frozen=True)
class TrainingRun(Report):
    """The run's processes, its pace and where its features came from."""

    world_size: int
    tokens_per_s: float  # after the warm-up steps; 0.0 when every step of this run was one
    warmup_s: float
    padding_share: float
    compiled: bool
    compile_failed_at_step: int | None  # None: no compilation failed
    features: str  # "stored" (extracted shards), or "online <engine>": the target ran on every batch
    target_forward_share: float | None  # of the step time, the target's forward; None: stored
