"""A process's state as /proc/<pid>/stat gives it, for tests that freeze, kill and wait on
processes they did not start themselves (a torchrun worker, a stage under dvc, a server's child).
Such a process is reaped by its own parent at any moment, and reading the file of one being reaped
fails with ESRCH (ProcessLookupError), not only ENOENT once it is gone."""

from __future__ import annotations

import contextlib
from pathlib import Path


def process_state(pid: int) -> str:
    """The state letter after the command name in parentheses (R, S, D; T: stopped; Z: ended, not
    yet reaped), X once the process is gone."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return "X"


def running(pid: int) -> bool:
    """Neither ended nor gone (a stopped process is still running)."""
    return process_state(pid) not in ("Z", "X")


def frozen(pid: int) -> bool:
    """Stopped by SIGSTOP."""
    return process_state(pid) == "T"
