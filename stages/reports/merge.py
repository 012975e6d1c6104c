"""reports/merge.json, written by the merge stage and read by the report stage."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import ClassVar

from .record import Report


@dataclass(frozen=True)
class MergeCounts:
    """What one split holds of one dataset (or of all of them)."""

    samples: int  # training sequences
    conversations: int  # the samples of generate they come from
    duplicates: int
    tokens: int
    supervised_tokens: int  # the target's turns: the only positions trained on
    turns: int
    truncated: int
    shortened: int

    @classmethod
    def total(cls, parts: Iterable[MergeCounts]) -> MergeCounts:
        """Every count summed over `parts` (zeros for none)."""
        held = list(parts)
        return cls(**{f.name: sum(getattr(p, f.name) for p in held) for f in fields(cls)})


@dataclass(frozen=True)
class SplitTotals:
    train: MergeCounts
    eval: MergeCounts


@dataclass(frozen=True)
class SplitsByDataset:
    train: dict[str, MergeCounts]
    eval: dict[str, MergeCounts]


@dataclass(frozen=True)
class MergeReport(Report):
    """The merged splits' counts, over every dataset and per dataset."""

    STAGE: ClassVar[str] = "merge"

    summary: SplitTotals
    per_dataset: SplitsByDataset
