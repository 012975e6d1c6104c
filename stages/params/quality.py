"""The `quality` section: the gate's thresholds."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Section, param


@dataclass(frozen=True)
class QualityParams(Section):
    """The gate before the expensive stages: each rate against its threshold."""

    KEY = "quality"

    min_reasoning_closed: float = param(
        0.9, "Share of outputs whose reasoning closes (datasets expecting reasoning).", ge=0, le=1
    )
    max_empty_reasoning: float = param(0.5, "Share of empty reasoning allowed.", ge=0, le=1)
    max_truncated: float = param(0.1, "Share of outputs cut at max_new_tokens allowed.", ge=0, le=1)
    min_tool_call_share: float = param(
        0.5, "Share of outputs with a tool call (datasets expecting tool calls).", ge=0, le=1
    )
    max_unbalanced_tool_calls: float = param(
        0.0, "Share of outputs with an unclosed tool call allowed.", ge=0, le=1
    )
    max_failed: float = param(0.05, "Share of failed generations allowed.", ge=0, le=1)
    histogram_buckets: int = param(10, "Buckets of the length histograms.", ge=1)
