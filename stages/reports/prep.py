"""reports/prep/<dataset>.json, written by prep@<dataset> and read by the quality stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .record import Report


@dataclass(frozen=True)
class PrepReport(Report):
    """What one pass over a dataset's source met: every row is counted where it went, so a row
    skipped is never silently lost."""

    STAGE: ClassVar[str] = "prep"

    dataset: str
    rows: int  # read from the source
    malformed: int  # skipped (skip_bad_rows)
    duplicate: int
    too_long: int  # a prompt over max_prompt_tokens
    sampled_out: int  # past max_samples
    kept: int
    turns: int  # the target's turns among the kept rows
    malformed_examples: list[str]  # the first malformed rows' messages, to find and fix them
