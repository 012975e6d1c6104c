"""reports/train.json, written by the train stage and read by the report stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .record import Report



@dataclass(frozen=True)
class TrainReport(Report):
    """The run's length and loss, the best evaluation (that of the exported checkpoint) and how
    fast the steps ran."""

    STAGE: ClassVar[str] = "train"

    steps: int
    final_loss: float | None  # None: NaN (a diverged run)
    best_step: int | None  # None: no evaluation ran
    best_replayed_tau: float | None
    best_simulated_tau: float | None
    eval_num_steps: int
    world_size: int
    tokens_per_s: float  # after the warm-up steps; 0.0 when every step of this run was one
    warmup_s: float
    padding_share: float
    compiled: bool
    compile_failed_at_step: int | None  # None: no compilation failed
    features: str  # "stored" (extracted shards), or "online <engine>": the target ran on every batch
    target_forward_share: float | None  # of the step time, the target's forward; None: stored
