"""What the training loop (training.py `train`) needs of an objective, so that one loop trains
every drafter (EAGLE-3's training-time test, DFlash's blocks) with no branch per drafter: a
forward(batch) -> (loss, metrics) over the collated features, metrics that add up over batches
and ranks, and the evaluation figures the loop logs and selects the best checkpoint by."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol, Self

import torch
from torch import Tensor, nn


class Metrics(Protocol):
    """A batch's figures as sums, a dataclass of tensors: batches add with `+`, and the loop sums
    them over the ranks field by field (rates are ratios of sums, so both are exact)."""

    def __add__(self, other: Any) -> Any: ...

    @property
    def accuracy(self) -> list[float]:
        """Per draft position, the share of the target's tokens the draft's argmax matches."""
        ...


def feature_dtype(device: torch.device) -> torch.dtype | None:
    """Features stay in their stored dtype (bf16) up to the GPU, where the target's LM head then
    runs in that dtype as it does when serving; CPU training computes in fp32."""
    return None if device.type == "cuda" else torch.float32


class LoopObjective(nn.Module, ABC):
    """A drafter with the frozen target tensors it trains against (`embed`, `lm_head`, buffers
    its subclass registers); forward(batch) -> (loss, Metrics)."""

    # The evaluation figure checkpoints are selected by (larger is better): its key in the
    # evaluation's row, and DVCLive's eval/<ACCEPTANCE>.
    ACCEPTANCE: ClassVar[str]
    drafter: nn.Module
    embed: Tensor
    lm_head: Tensor
    world: int = 1  # data-parallel processes; set by the loop

    @abstractmethod
    def zero_metrics(self, device: torch.device) -> Metrics:
        """Metrics of no batch: what an evaluation adds its batches to."""

    @abstractmethod
    def acceptance(self, metrics: Any) -> float:
        """The figure checkpoints are selected by (larger is better): tokens per verify step."""

    @abstractmethod
    def evaluation(self, metrics: Any) -> dict[str, Any]:
        """An evaluation's figures as the run's history keeps them: `acceptance`, rounded, under
        ACCEPTANCE among them."""

    @abstractmethod
    def describe(self, evaluation: dict[str, Any]) -> str:
        """The evaluation's figures for the log line."""

    def loop_state(self) -> dict[str, Tensor]:
        """What a checkpoint keeps of the objective beside the drafter, for an exact resume."""
        return {}

    def load_loop_state(self, state: dict[str, Tensor]) -> None:
        """Restore what `loop_state` returned."""

    def place(self, device: torch.device) -> Self:
        """Move to `device`; the frozen target tensors stay in their stored dtype (bf16) on a GPU,
        as the target computes with them (a float32 copy would double their memory: 9.4 GB at
        Kimi-K2.5's vocabulary), and become float32 on the CPU, as the features do."""
        dtype = feature_dtype(device)
        if dtype is not None:
            self.embed, self.lm_head = self.embed.to(dtype), self.lm_head.to(dtype)
        return self.to(device)
