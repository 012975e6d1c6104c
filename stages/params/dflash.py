"""The `dflash` section: the DFlash draft (block diffusion: a block of masked positions filled in
one forward) and its training run; the loop's knobs and the keys every drafter's section holds
are DrafterKeys' (drafting.py), declared once for `train` and `dflash`."""

from __future__ import annotations

from dataclasses import dataclass

from .drafting import DrafterKeys
from .schema import Section, param


@dataclass(frozen=True)
class DFlashParams(Section, DrafterKeys):
    """The DFlash draft, trained on random anchors of the target's own replies."""

    KEY = "dflash"

    block_size: int = param(
        16,
        "Tokens per block, the anchor included: one verify step checks block_size - 1 drafts "
        "(16 in the DFlash paper).",
        ge=2,
    )
    num_layers: int = param(
        1, "Draft decoder layers: more draft better and cost more per step.", ge=1
    )
    num_anchors: int = param(
        512, "Blocks drawn per training sample (random supervised anchors, distinct).", ge=1
    )
    decay_gamma: float | None = param(
        7.0,
        "Loss weight of block position k is exp(-(k - 1) / decay_gamma) (the paper: 7 for "
        "blocks of 16, 5 for 10, 4 for 8); null weighs every position alike.",
        gt=0,
    )
    mask_token_id: int | None = param(
        None,
        "The target's token id that fills a block's drafted positions: one generation never "
        "emits (a reserved or padding token), never a role or stop token (the check stage "
        "refuses those).",
        ge=0,
    )
