"""The `vocab` section."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Section, param


@dataclass(frozen=True)
class VocabParams(Section):
    """The draft's vocabulary."""

    KEY = "vocab"

    draft_vocab_size: int = param(
        32000, "Target ids the drafter can propose (the most frequent supervised ones).", ge=1
    )
