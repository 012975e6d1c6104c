"""reports/generate/<dataset>.json, written by generate@<dataset> and read by the report stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from .record import Report

# What a run did rather than what its output holds: a rerun that generated nothing keeps the
# report of the run that did, so the report (a DVC output) hashes as before.
RUN_ONLY = ("new_samples", "new_turns", "tokens_per_s", "engine")


@dataclass(frozen=True)
class GenerateReport(Report):
    """What a dataset's raw data holds, and what the last run added to it and how fast."""

    STAGE: ClassVar[str] = "generate"

    dataset: str
    samples: int
    prompts: int
    new_samples: int
    turns: int
    new_turns: int
    stopped_at_prompt_limit: int
    tokens: int
    budget_tokens: int
    budget_overshoot_tokens: int
    budget_reached: bool
    failed: int  # turns the engine aborted
    # Over the generation loop alone: a server's start (`launch`) and the compaction aside.
    tokens_per_s: float | None  # None: this run generated nothing
    engine: str
    fingerprint: str | None  # None: no turn generated yet

    def describes_as(self, other: GenerateReport) -> bool:
        """Whether both describe the same output (RUN_ONLY aside)."""
        ran = {name: getattr(other, name) for name in RUN_ONLY}
        return dataclasses.replace(self, **ran) == other
