"""The draft vocabulary: the target ids the draft's lm_head predicts.

Counted over supervised tokens only (what the draft learns to predict). The mapping follows the
checkpoint format both engines read: `target_id = i + d2t[i]` for draft index i, and `t2d[t]` is
true for the target ids kept.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


def count_supervised_tokens(
    input_ids: Iterable[Tensor], loss_masks: Iterable[Tensor], vocab_size: int
) -> Tensor:
    """Frequency of each target id among supervised positions, over batches of ids and masks."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for batch, (ids, mask) in enumerate(zip(input_ids, loss_masks, strict=True)):
        if ids.shape != mask.shape:
            raise ValueError(
                f"batch {batch}: input_ids {tuple(ids.shape)} and loss mask "
                f"{tuple(mask.shape)} differ in shape"
            )
        supervised = ids[mask.bool()].long()
        if supervised.numel() and (supervised.min() < 0 or supervised.max() >= vocab_size):
            raise ValueError(
                f"batch {batch}: token id {int(supervised.max())} or "
                f"{int(supervised.min())} is outside the vocabulary of {vocab_size}; "
                f"is vocab_size the target's?"
            )
        counts += torch.bincount(supervised.cpu(), minlength=vocab_size)
    return counts


def build_draft_vocab(token_counts: Tensor, draft_vocab_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """(d2t, t2d, used_ids): the `draft_vocab_size` most frequent ids, sorted ascending.

    Ties are broken by lower id; when fewer ids ever occur, the lowest unused ids fill the rest,
    so the vocabulary always has exactly `draft_vocab_size` entries.
    """
    vocab_size = token_counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(
            f"draft_vocab_size {draft_vocab_size} must be in 1..{vocab_size} "
            f"(the target vocabulary size)"
        )
    # A stable sort keeps ascending id order among equal counts.
    order = torch.sort(token_counts.long(), descending=True, stable=True).indices
    used = order[:draft_vocab_size].sort().values
    d2t = used - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d, used


def coverage(token_counts: Tensor, t2d: Tensor) -> float:
    """Share of the counted tokens that the draft vocabulary can predict."""
    total = int(token_counts.sum())
    return float(token_counts[t2d].sum()) / total if total else 0.0
