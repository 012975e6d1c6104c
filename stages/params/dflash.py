"""The `dflash` section: the DFlash draft (block diffusion: a block of masked positions filled in
one forward) and its training run; the loop's knobs and the keys every drafter's section holds
are DrafterKeys' (drafting.py), declared once for `train` and `dflash`."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.errors import ParamsError
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
    target_layer_ids: list[int] | None = param(
        None,
        "SGLang's ids of the target layers the draft reads (id k: layer k's output, HF "
        "hidden_states[k + 1]), ascending; null: what SGLang picks for num_layers draft "
        "layers (the middle layer for one, else spread over 1 .. N - 3). The extract stage "
        "captures them beside EAGLE-3's.",
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

    def __post_init__(self) -> None:
        super().__post_init__()
        ids = self.target_layer_ids
        if ids is not None and (not ids or ids[0] < 0 or sorted(set(ids)) != ids):
            raise ParamsError(
                f"dflash.target_layer_ids: {ids} must be distinct target layer ids from 0 in "
                "ascending order, e.g. [1, 15, 29] (or null for SGLang's choice)"
            )
