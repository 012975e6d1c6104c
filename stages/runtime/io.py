"""Atomic writes and progress reporting shared by the stages.

Every output is written to a temporary sibling and renamed into place when complete, so a killed
stage never leaves a half-written file where a later stage would read it.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


@contextlib.contextmanager
def atomic_path(final: Path | str) -> Iterator[Path]:
    """Yield a temp path beside `final`; on success replace `final` with it, else remove it."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final, os.getpid())
    _remove(tmp)
    try:
        yield tmp
        if tmp.is_dir() and final.exists():
            _remove(final)
        os.replace(tmp, final)
    finally:
        _remove(tmp)


def temp_path(final: Path, pid: int) -> Path:
    """Where process `pid` writes `final` before renaming it into place."""
    return final.with_name(f".{final.name}.tmp-{pid}")


_TEMP = re.compile(r"^\..+\.tmp-(\d+)$")


def remove_stale_temps(directory: Path | str) -> list[Path]:
    """Remove the temp files (`.<name>.tmp-<pid>`) in `directory` whose process is gone.

    A kill -9 runs no cleanup, and a stage's output directory is hashed by DVC as a whole, so a
    dead writer's half-written shard would join the output. A running process's temp files are
    kept: under torchrun the other ranks write into the same directory (pids are this host's: a
    directory shared between hosts needs every host's writers stopped first).
    """
    directory = Path(directory)
    stale = [
        p
        for p in directory.glob(".*.tmp-*")
        if (m := _TEMP.match(p.name)) and not _running(int(m.group(1)))
    ]
    for path in stale:
        _remove(path)
    if stale:
        print(
            f"[io] removed {len(stale)} temp file(s) of killed processes in {directory}: "
            f"{', '.join(p.name for p in stale)}"
        )
    return stale


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def write_parquet(table: pa.Table, path: Path | str) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def write_json(obj, path: Path | str) -> None:
    """JSON with NaN written as null (a rate over zero cases), which every reader accepts."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(_finite(obj), indent=2, allow_nan=False) + "\n")


def _finite(obj):
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_csv(rows: list[dict], path: Path | str, columns: list[str] | None = None) -> None:
    """A CSV for `dvc plots`; the header comes from `columns`, else from the first row."""
    columns = columns or (list(rows[0]) if rows else [])
    buf = io.StringIO()
    if columns:
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    write_text(buf.getvalue(), path)


def write_text(text: str, path: Path | str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


class Progress:
    """Items and tokens done, tokens/s and ETA against a token or item budget, on stderr.

    Plain text lines (not a live bar) so the output stays readable in `dvc repro` logs and CI.
    """

    def __init__(
        self,
        label: str,
        total_items: int,
        token_budget: int | None = None,
        every_s: float = 2.0,
        stream=sys.stderr,
    ):
        self.label, self.total_items, self.token_budget = label, total_items, token_budget
        self.items = self.tokens = 0
        self.every_s, self.stream = every_s, stream
        self.start = self.last = time.monotonic()

    def update(self, items: int, tokens: int) -> None:
        self.items += items
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= self.every_s or self.items >= self.total_items:
            self.last = now
            print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.tokens / elapsed
        item_left = (self.total_items - self.items) / max(self.items / elapsed, 1e-9)
        eta = item_left
        if self.token_budget:
            eta = min(eta, max(self.token_budget - self.tokens, 0) / max(rate, 1e-9))
        budget = f"/{self.token_budget:,}" if self.token_budget else ""
        return (
            f"[{self.label}] {self.items}/{self.total_items} samples  "
            f"{self.tokens:,}{budget} tokens  {rate:,.0f} tok/s  "
            f"elapsed {_hms(elapsed)}  eta {_hms(eta) if self.items else '?'}"
        )


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
