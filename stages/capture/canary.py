"""The canary's arithmetic: stored-to-be features against a second source, layer by layer.

Per aux slot j (HF index i_j) the relative error ||got_j - ref_i|| / ||ref_i|| over every token
of the samples, and the reference index the slot matches best. A slot passes when its error is
under the threshold and its best match is its own index: a capture that is off by one layer
(the classic layer-id mistake) lands on a neighbour, which the hf reference also holds, so it
fails even where neighbouring layers differ little. The final post-norm state is compared when
the reference has it (the HTTP path returns only the aux layers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .hooks import FeatureExtractor


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
    errors: dict[int, float] = field(default_factory=dict)  # against every index the reference has


@dataclass(frozen=True)
class CanaryReport:
    slots: list[SlotError]
    last_rel_error: float | None  # None: the reference has no final state
    threshold: float
    tokens: int

    def slot_ok(self, s: SlotError) -> bool:
        return s.rel_error <= self.threshold and s.best_index == s.index

    @property
    def passed(self) -> bool:
        last_ok = self.last_rel_error is None or self.last_rel_error <= self.threshold
        return last_ok and all(self.slot_ok(s) for s in self.slots)

    def lines(self) -> list[str]:
        out = [f"{'slot':<6}{'HF index':>9}{'rel error':>12}{'closest index':>15}  verdict"]
        for s in self.slots:
            out.append(
                f"{s.slot:<6}{s.index:>9}{s.rel_error:>12.2e}{s.best_index:>15}  "
                f"{'ok' if self.slot_ok(s) else 'FAIL'}"
            )
        if self.last_rel_error is not None:
            verdict = "ok" if self.last_rel_error <= self.threshold else "FAIL"
            out.append(f"{'last':<6}{'final':>9}{self.last_rel_error:>12.2e}{'':>15}  {verdict}")
        out.append(
            f"{'PASS' if self.passed else 'FAIL'}: {self.tokens:,} tokens, threshold "
            f"{self.threshold:g} relative error per layer"
        )
        return out


def compare(
    got_aux: torch.Tensor,
    got_last: torch.Tensor | None,
    reference: Mapping[int, torch.Tensor],
    ref_last: torch.Tensor | None,
    aux_indices: Sequence[int],
    threshold: float,
) -> CanaryReport:
    """`got_aux` [T, len(aux_indices) * H] and `got_last` [T, H] against the reference's states
    by HF index ({i: [T, H]}, at least aux_indices) and its final state, over the same T tokens."""
    missing = [i for i in aux_indices if i not in reference]
    if missing:
        raise ValueError(f"the reference has no hidden states at HF indices {missing}")
    hidden = got_aux.shape[-1] // len(aux_indices)
    slots = []
    for j, index in enumerate(aux_indices):
        part = got_aux[:, j * hidden : (j + 1) * hidden]
        errors = {i: relative_error(part, ref) for i, ref in sorted(reference.items())}
        best = min(errors, key=errors.__getitem__)
        slots.append(SlotError(j, index, errors[index], best, errors))
    last = (
        relative_error(got_last, ref_last)
        if got_last is not None and ref_last is not None
        else None
    )
    return CanaryReport(slots, last, threshold, int(got_aux.shape[0]))


def neighbourhood(aux_indices: Sequence[int], num_layers: int, reach: int = 1) -> list[int]:
    """The indices within `reach` of each aux index (0..N-1): what the hf reference captures."""
    return sorted(
        {j for i in aux_indices for j in range(i - reach, i + reach + 1) if 0 <= j < num_layers}
    )


@torch.inference_mode()
def hf_reference(
    model, input_ids: Sequence[Sequence[int]], indices: Sequence[int]
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """({HF index: [T, H]}, final state [T, H]) in float32 on the CPU, over the samples'
    concatenated tokens, each sample run alone (no padding) with hooks on the layers `indices`."""
    extractor = FeatureExtractor(model, list(indices))
    device = next(model.parameters()).device
    hidden = int(model.config.hidden_size)
    parts: dict[int, list[torch.Tensor]] = {i: [] for i in indices}
    lasts = []
    for ids in input_ids:
        x = torch.tensor([list(ids)], device=device)
        aux, last = extractor(x, torch.ones_like(x))
        for j, i in enumerate(indices):
            parts[i].append(aux[0, :, j * hidden : (j + 1) * hidden].float().cpu())
        lasts.append(last[0].float().cpu())
    return {i: torch.cat(p) for i, p in parts.items()}, torch.cat(lasts)
