"""reports/check.json, written by the check stage once every key of params.yaml passed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from .record import Report


@dataclass(frozen=True)
class CheckReport(Report):
    """The same bytes whenever the check passes: every other stage depends on the file, so a
    passing check reruns nothing after it."""

    STAGE: ClassVar[str] = "check"

    params: Literal["checked"] = "checked"
