"""reports/vocab.json, written by the vocab stage and read by the report stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .record import Report


@dataclass(frozen=True)
class VocabReport(Report):
    """The draft vocabulary's size against the target's, and the share of supervised tokens it
    can produce."""

    STAGE: ClassVar[str] = "vocab"

    draft_vocab_size: int
    target_vocab_size: int
    distinct_supervised_tokens: int
    supervised_tokens: int
    coverage: float  # share of supervised tokens the draft vocabulary holds
