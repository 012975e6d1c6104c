"""reports/quality.json, written by the quality stage: the figures of its gate, per dataset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .record import Report


@dataclass(frozen=True)
class DatasetQuality:
    """One dataset's prep counts, the columns of every quality question that gives one row per
    dataset (stages/queries/*.sql) and the median and 95th percentile of each length measure.
    None where the dataset has no such row (no prep report, no generated reply)."""

    rows: int | None = None  # prep
    kept: int | None = None
    duplicate: int | None = None
    too_long: int | None = None
    malformed: int | None = None
    samples: int | None = None  # replies (finish_reasons)
    reasoning_opened_share: float | None = None  # reasoning_presence
    reasoning_closed_share: float | None = None
    empty_reasoning_share: float | None = None
    stop_share: float | None = None  # finish_reasons
    truncated_share: float | None = None
    failed_share: float | None = None
    failed: int | None = None
    tools_offered_share: float | None = None  # tool_call_integrity
    tool_call_share: float | None = None
    tool_calls: int | None = None
    unbalanced_share: float | None = None
    duplicates: int | None = None  # duplicates
    turns: int | None = None  # turns_per_sample
    turns_per_sample: float | None = None
    max_turns: int | None = None
    budget_tokens: int | None = None  # budget_used
    generated_tokens: int | None = None
    budget_used_share: float | None = None
    answer_p50: float | None = None  # length_distribution, in tokens
    answer_p95: float | None = None
    completion_p50: float | None = None
    completion_p95: float | None = None
    prompt_p50: float | None = None
    prompt_p95: float | None = None
    reasoning_p50: float | None = None
    reasoning_p95: float | None = None
    total_p50: float | None = None
    total_p95: float | None = None


@dataclass(frozen=True)
class QualityReport(Report):
    """Whether the gate passed, and every dataset's figures it judged."""

    STAGE: ClassVar[str] = "quality"

    gate_passed: bool
    datasets: dict[str, DatasetQuality]
