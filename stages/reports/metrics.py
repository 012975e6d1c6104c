"""reports/metrics.json: THE DVC metrics file, the figures a run is judged by, written by the
report stage from the other stages' reports (stages/reporting/summary.py says how); and beside
it reports/metrics_notes.json, why each null figure is null.

Flat and numbers only, so that `dvc metrics show` prints a run as one row of figures: each key
names its unit, and the benchmark's tau comes as one key per temperature (tau_key). A figure the
run cannot give is null, which `dvc metrics show` leaves out of its row. Its reason goes in the
notes, not in the metrics file: DVC reads every value of a metrics file as a metric, and would
print each reason as a column of prose. A null without its reason, or a reason for a figure that
has a number, is refused when the notes are made, so neither is ever written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from .record import Mismatch, Report, decode, encode

WHY_NULL = "why_null"
TAUS = "benchmark_tau_tokens_per_step"  # the field written as one tau_key per temperature
_TAU_KEY = re.compile(r"benchmark_tau_t(.+)_tokens_per_step")


def tau_key(temperature: float) -> str:
    """`benchmark_tau_t0_tokens_per_step` at 0.0, `benchmark_tau_t0.7_tokens_per_step` at 0.7."""
    label = str(int(temperature)) if float(temperature).is_integer() else f"{temperature:g}"
    return f"benchmark_tau_t{label}_tokens_per_step"


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
    benchmark_tau_tokens_per_step: dict[float, float | None]  # per temperature
    extract_tokens_per_s: float | None
    train_tokens_per_s: float | None

    def figures(self) -> dict[str, Any]:
        """Every figure under its key in the file, in order (the taus as tau_key's)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == TAUS:
                out.update(
                    {tau_key(t): tau for t, tau in self.benchmark_tau_tokens_per_step.items()}
                )
            else:
                out[f.name] = getattr(self, f.name)
        return out

    def to_json(self) -> dict[str, Any]:
        return encode(self.figures())

    @classmethod
    def from_json(cls, data: object) -> RunMetrics:
        if not isinstance(data, dict):
            raise Mismatch("", "the file holds no JSON object")
        taus = {m.group(1): v for k, v in data.items() if (m := _TAU_KEY.fullmatch(k))}
        rest = {k: v for k, v in data.items() if not _TAU_KEY.fullmatch(k)}
        return decode(cls, {**rest, TAUS: taus})


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
