"""Features computed on each training batch (`extract.store: none`), as the shards would hold them.

- `RankFeatures` (the hf engine): a whole target on this rank's device runs this rank's batch
  through the hooks extraction uses.
- `GroupFeatures` (the sglang engine): a `Capture` whose forwards are tensor parallel over every
  rank. The drafter's data-parallel ranks are the target's tensor-parallel ranks, so each call
  gathers every rank's samples, all ranks run them in one forward, and each keeps its own. Every
  rank must call it the same number of times (`join` when a rank has no batch of its own).

Both round the features to the stored dtype, then give them in the training dtype, so online
training reads what offline training would read from the shards, and both count the seconds
spent (the device synchronised, so it is the forward's time, not its launch).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from .hooks import FeatureExtractor
from .interface import Capture


class OnlineFeatures:
    """What the training loop calls: a batch in, the batch with `aux` and `last` out; `seconds`
    is the time spent in the target so far."""

    seconds: float = 0.0

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def join(self) -> None:
        """A rank without a batch this round: nothing to do unless the calls are collective."""

    def _count(self, started: float, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.seconds += time.perf_counter() - started


def stored_then(x: torch.Tensor, stored: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """Rounded to the stored dtype, then a copy in the training dtype made outside inference mode
    (autograd may keep it for the backward pass)."""
    return x.to(stored).to(dtype, copy=True)


class RankFeatures(OnlineFeatures):
    """The target on this rank's device, run on this rank's batch without grad."""

    def __init__(self, extractor: FeatureExtractor, stored: torch.dtype, dtype: torch.dtype):
        self.extractor, self.stored, self.dtype = extractor, stored, dtype

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        aux, last = self.extractor(batch["input_ids"], batch["attention_mask"].long())
        aux, last = (stored_then(x, self.stored, self.dtype) for x in (aux, last))
        self._count(started, batch["input_ids"].device)
        return {**batch, "aux": aux, "last": last}


class GroupFeatures(OnlineFeatures):
    """A tensor-parallel capture over every rank, each rank keeping its own samples' features."""

    def __init__(
        self, capture: Capture, rank: int, world: int, stored: torch.dtype, dtype: torch.dtype
    ):
        self.capture, self.rank, self.world = capture, rank, world
        self.stored, self.dtype = stored, dtype

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        started = time.perf_counter()
        ids, mask = batch["input_ids"], batch["attention_mask"]
        lengths = mask.sum(1).tolist()
        mine = [ids[b, :n].tolist() for b, n in enumerate(lengths)]
        hidden = self.capture.hidden_size
        aux = torch.zeros(*ids.shape, self.width, dtype=self.dtype, device=ids.device)
        last = torch.zeros(*ids.shape, hidden, dtype=self.dtype, device=ids.device)
        for b, a, h in self._run(mine):  # copied into fresh tensors, in the training dtype
            aux[b, : lengths[b]] = a.to(aux.device, self.stored)
            last[b, : lengths[b]] = h.to(last.device, self.stored)
        self._count(started, ids.device)
        return {**batch, "aux": aux, "last": last}

    def join(self) -> None:
        """Take part in the group's forward with no samples of this rank's own."""
        for _ in self._run([]):
            pass

    @property
    def width(self) -> int:
        return len(self.capture.aux_indices) * self.capture.hidden_size

    def _run(self, mine: Sequence[Sequence[int]]):
        """(index in `mine`, aux, last) of this rank's samples, after one forward of everyone's."""
        everyone: list = [None] * self.world
        if self.world > 1:
            torch.distributed.all_gather_object(everyone, list(mine))
        else:
            everyone = [list(mine)]
        offset = sum(len(samples) for samples in everyone[: self.rank])
        group = [sample for samples in everyone for sample in samples]
        if not group:
            return
        for pos, aux, last in self.capture.capture(group):
            if offset <= pos < offset + len(mine):
                yield pos - offset, aux, last
