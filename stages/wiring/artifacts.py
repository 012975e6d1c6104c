"""The artifacts several stages read, checked, or a stage error saying what to run."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..artifacts.raw import verified_parts
from ..cli import StageError
from ..runtime.files import ChecksumError


def raw_files(raw_dirs: Iterable[Path], stage: str) -> list[str]:
    """Every raw part under `raw_dirs`, each checked against its recorded size and sha256."""
    raw_dirs = list(raw_dirs)
    try:
        files = [str(p) for d in raw_dirs for p in verified_parts(d)]
    except ChecksumError as err:
        raise StageError(
            f"{stage}: {err}; rerun generate for its dataset, which drops a damaged part and "
            f"generates its turns again"
        ) from None
    if not files:
        raise StageError(
            f"{stage}: no raw generations under {sorted(str(d) for d in raw_dirs)}; run the "
            f"generate stages first"
        )
    return files
