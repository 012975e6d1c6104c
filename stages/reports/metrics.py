"""reports/metrics.json: THE DVC metrics file, the figures a run is judged by, written by the
report stage from the other stages' reports (stages/reporting/summary.py says how); and beside
it reports/metrics_notes.json, why each null figure is null.

Flat and numbers only, so that `dvc metrics show` prints a run as one row of figures: each key
names its unit, and each drafter family's tau comes at T = 0, the temperature a drafter is quoted
at (stages/reporting/summary.py says why only there). A figure the run cannot give is null, which
`dvc metrics show` leaves out of its row. Its reason goes in the
notes, not in the metrics file: DVC reads every value of a metrics file as a metric, and would
print each reason as a column of prose. A null without its reason, or a reason for a figure that
has a number, is refused when the notes are made, so neither is ever written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .record import Mismatch, Report

WHY_NULL = "why_null"


@dataclass(frozen=True)
class RunMetrics(Report):
    """The figures, in the order the file lists them."""

    STAGE: ClassVar[str] = "report"

    generated_samples: int
    generated_tokens: int
    train_supervised_tokens: int
    reasoning_closed_min_share: float | None  # the worst dataset expecting reasoning
    truncated_max_share: float | None
    tool_call_min_share: float | None  # the worst dataset expecting tool calls
    vocab_coverage_share: float
    replayed_tau_best_tokens_per_step: float | None
    benchmark_tau_t0_tokens_per_step: float | None  # EAGLE-3's, at T = 0
    dflash_tau_t0_tokens_per_step: float | None  # DFlash's, at T = 0
    extract_tokens_per_s: float | None
    train_tokens_per_s: float | None

    def figures(self) -> dict[str, Any]:
        """Every figure under its key in the file, in order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class MetricsNotes(Report):
    """reports/metrics_notes.json: why each null figure of reports/metrics.json has no number."""

    STAGE: ClassVar[str] = "report"

    why_null: dict[str, str]  # per null figure's key

    @classmethod
    def of(cls, metrics: RunMetrics, why_null: Mapping[str, str]) -> MetricsNotes:
        """The notes of `metrics`: a reason for each null figure and for no other."""
        nulls = [k for k, v in metrics.figures().items() if is_null(v)]
        if unexplained := [k for k in nulls if k not in why_null]:
            raise Mismatch(WHY_NULL, f'figure "{unexplained[0]}" is null, with no reason given')
        if stray := [k for k in why_null if k not in nulls]:
            raise Mismatch(WHY_NULL, f'a reason for "{stray[0]}", which is not null')
        return cls(dict(why_null))


def is_null(value: object) -> bool:
    """A figure written as null: None, or NaN (write_json writes it as null)."""
    return value is None or (isinstance(value, float) and math.isnan(value))
