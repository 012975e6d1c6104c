"""reports/train.json, written by the train stage and read by the report stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .training import TrainingRun



@dataclass(frozen=True)
class TrainReport(TrainingRun):
    """The run's length and loss, the best evaluation (that of the exported checkpoint); how fast
    the steps ran is TrainingRun's."""

    STAGE: ClassVar[str] = "train"

    steps: int
    final_loss: float | None  # None: NaN (a diverged run)
    best_step: int | None  # None: no evaluation ran
    best_replayed_tau: float | None
    best_simulated_tau: float | None
    eval_num_steps: int
