"""reports/train_dflash.json, written by the train_dflash stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .training import TrainingRun


@dataclass(frozen=True)
class TrainDFlashReport(TrainingRun):
    """The run's length and loss, the best evaluation (that of the exported checkpoint: its tau,
    the tokens one verify step accepts on the eval split); how fast the steps ran is
    TrainingRun's."""

    STAGE: ClassVar[str] = "train_dflash"

    steps: int
    final_loss: float | None  # None: NaN (a diverged run)
    best_step: int | None  # None: no evaluation ran
    best_tau: float | None  # mean leading correct drafts per block + 1, on the eval split
    best_accuracy: list[float]  # per draft position 1 .. block_size - 1, at the best evaluation
    block_size: int
    target_layer_ids: list[int]  # SGLang's, from the captured HF indices
    seconds: float  # this run's training steps, evaluations and checkpoints, wall clock
