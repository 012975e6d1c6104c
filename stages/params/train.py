"""The `train` section: the EAGLE-3 draft and its training loop (the loop's own knobs are
LoopKnobs' fields, in stages/drafter/knobs.py, the keys every drafter's section holds
DrafterKeys', in drafting.py; the keys below are EAGLE-3's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..drafter.knobs import TTTKnobs
from .drafting import DrafterKeys
from .schema import Section


@dataclass(frozen=True)
class TrainParams(Section, DrafterKeys, TTTKnobs):
    """The EAGLE-3 draft, trained with training-time test."""

    KEY = "train"
