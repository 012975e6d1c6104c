"""The canary's arithmetic: stored-to-be features against a second source, layer by layer.

Per aux slot j (HF index i_j) the relative error ||got_j - ref_i|| / ||ref_i|| over every token
of the samples, and the reference index the slot matches best. A slot passes when its error is
under its threshold and its best match is its own index: a capture that is off by one layer
(the classic layer-id mistake) lands on a neighbour, which the hf reference also holds, so it
fails even where neighbouring layers differ little. The final post-norm state is compared when
the reference has it (the HTTP path returns only the aux layers).

The threshold rests on the reference's own noise floor, per slot: how far two correct captures of
the same tokens lie apart. It is the largest of what the canary measures on its samples: the
reference run again batched otherwise (each alone, then all in one padded batch; or one request
at a time, then all at once), the hf reference's arithmetic in its dtype against the same
weights in float32 (another engine's kernels round otherwise, by as much), and the reference
rounded to the stored dtype. Batching alone is no floor: the same kernels give the same bits in
any batch on a CPU, and on a GPU too where the kernel does not depend on the batch. A slot's
threshold is FLOOR_MARGIN times its floor and at least MIN_THRESHOLD
(`extract.canary.max_rel_error` instead, when set); both are measured: docs/performance.md,
"The capture's noise floor".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from .hooks import FeatureExtractor

Key = TypeVar("Key")  # an HF index, or "last"

# A slot's threshold: this many times its floor. Another engine's kernels (SGLang's, or packed
# and compiled ones) move the features more than batching the reference does; the measured ratio
# and why this margin covers it: docs/performance.md, "The capture's noise floor".
FLOOR_MARGIN = 4.0
# ... and never below this, where everything runs and is stored in float32 and the floor is 0:
# float32 kernels of two engines still differ in their last bits
MIN_THRESHOLD = 1e-4


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| (Frobenius, in float64)."""
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


@dataclass(frozen=True)
class SlotError:
    slot: int  # position in the aux concatenation
    index: int  # the HF hidden_states index the slot must hold
    rel_error: float  # against the reference at `index`
    best_index: int  # the reference index the slot is closest to
    floor: float  # the reference's own noise at `index`
    threshold: float
    errors: dict[int, float] = field(default_factory=dict)  # against every index the reference has

    @property
    def ok(self) -> bool:
        return self.rel_error <= self.threshold and self.best_index == self.index


@dataclass(frozen=True)
class LastError:
    """The final post-norm state, where the reference has it."""

    rel_error: float
    floor: float
    threshold: float

    @property
    def ok(self) -> bool:
        return self.rel_error <= self.threshold


@dataclass(frozen=True)
class CanaryReport:
    slots: list[SlotError]
    last: LastError | None  # None: the reference has no final state
    tokens: int
    fixed_threshold: bool  # extract.canary.max_rel_error set: not derived from the floor

    @property
    def passed(self) -> bool:
        return (self.last is None or self.last.ok) and all(s.ok for s in self.slots)

    def lines(self) -> list[str]:
        head = f"{'slot':<6}{'HF index':>9}{'rel error':>12}{'floor':>10}{'threshold':>11}"
        out = [f"{head}{'closest index':>15}  verdict"]
        for s in self.slots:
            out.append(
                f"{s.slot:<6}{s.index:>9}{s.rel_error:>12.2e}{s.floor:>10.1e}"
                f"{s.threshold:>11.1e}{s.best_index:>15}  {'ok' if s.ok else 'FAIL'}"
            )
        if (last := self.last) is not None:
            out.append(
                f"{'last':<6}{'final':>9}{last.rel_error:>12.2e}{last.floor:>10.1e}"
                f"{last.threshold:>11.1e}{'':>15}  {'ok' if last.ok else 'FAIL'}"
            )
        rule = (
            "extract.canary.max_rel_error"
            if self.fixed_threshold
            else f"{FLOOR_MARGIN:g} x the floor (the reference batched otherwise, in float32, "
            f"stored), at least {MIN_THRESHOLD:g}"
        )
        out.append(f"{'PASS' if self.passed else 'FAIL'}: {self.tokens:,} tokens, threshold {rule}")
        return out


def floors(
    reference: Mapping[Key, torch.Tensor],
    others: Sequence[Mapping[Key, torch.Tensor]],
    stored: torch.dtype,
) -> dict[Key, float]:
    """Per index the reference's own noise: the largest relative error between it and each other
    run of it, and between it and itself rounded to `stored`."""
    return {
        k: max([relative_error(o[k], ref) for o in others] + [relative_error(ref.to(stored), ref)])
        for k, ref in reference.items()
    }


def compare(
    got_aux: torch.Tensor,
    got_last: torch.Tensor | None,
    reference: Mapping[int, torch.Tensor],
    ref_last: torch.Tensor | None,
    aux_indices: Sequence[int],
    floor: Mapping[Any, float],
    max_rel_error: float | None = None,
) -> CanaryReport:
    """`got_aux` [T, len(aux_indices) * H] and `got_last` [T, H] against the reference's states
    by HF index ({i: [T, H]}, at least aux_indices) and its final state, over the same T tokens.
    `floor`: the reference's noise per index (and "last"); each threshold FLOOR_MARGIN times it,
    at least MIN_THRESHOLD, or `max_rel_error` for all when given."""
    missing = [i for i in aux_indices if i not in reference]
    if missing:
        raise ValueError(f"the reference has no hidden states at HF indices {missing}")

    def threshold(key: int | str) -> float:
        if max_rel_error is not None:
            return max_rel_error
        return max(FLOOR_MARGIN * floor[key], MIN_THRESHOLD)

    hidden = got_aux.shape[-1] // len(aux_indices)
    slots = []
    for j, index in enumerate(aux_indices):
        part = got_aux[:, j * hidden : (j + 1) * hidden]
        errors = {i: relative_error(part, ref) for i, ref in sorted(reference.items())}
        best = min(errors, key=errors.__getitem__)
        slots.append(
            SlotError(j, index, errors[index], best, floor[index], threshold(index), errors)
        )
    last = None
    if got_last is not None and ref_last is not None:
        last = LastError(relative_error(got_last, ref_last), floor["last"], threshold("last"))
    return CanaryReport(slots, last, int(got_aux.shape[0]), max_rel_error is not None)


def neighbourhood(aux_indices: Sequence[int], num_layers: int, reach: int = 1) -> list[int]:
    """The indices within `reach` of each aux index (0..N-1): what the hf reference captures."""
    return sorted(
        {j for i in aux_indices for j in range(i - reach, i + reach + 1) if 0 <= j < num_layers}
    )


@torch.inference_mode()
def hf_reference(
    model, input_ids: Sequence[Sequence[int]], indices: Sequence[int], batched: bool = False
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({HF index: [T, H]}, final state [T, H]) in float32 on the CPU, over the samples'
    concatenated tokens, with hooks on the layers `indices`: each sample run alone (no padding),
    or (`batched`) all of them in one right-padded batch, the second run the floor is taken from."""
    extractor = FeatureExtractor(model, list(indices))
    device = next(model.parameters()).device
    hidden = int(model.config.hidden_size)
    parts: dict[int, list[torch.Tensor]] = {i: [] for i in indices}
    lasts = []
    groups = [list(input_ids)] if batched else [[ids] for ids in input_ids]
    for group in groups:
        x = torch.zeros(len(group), max(map(len, group)), dtype=torch.long, device=device)
        mask = torch.zeros_like(x)
        for b, ids in enumerate(group):
            x[b, : len(ids)], mask[b, : len(ids)] = torch.tensor(list(ids)), 1
        aux, last = extractor(x, mask)
        for b, ids in enumerate(group):
            for j, i in enumerate(indices):
                parts[i].append(aux[b, : len(ids), j * hidden : (j + 1) * hidden].float().cpu())
            lasts.append(last[b, : len(ids)].float().cpu())
    return {i: torch.cat(p) for i, p in parts.items()}, torch.cat(lasts)
