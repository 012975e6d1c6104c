"""The train stage's checkpoint swap killed (SIGKILL) at each of its renames: the next start
finishes it, and ends as the uninterrupted swap did, each run's checkpoints whole."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
from pathlib import Path

import pytest

from stages.runtime.swap import JOURNAL, OWN
from stages.train import CHECKPOINT_FORMAT, EARLIER, start_or_resume

RUNS = {
    name: {"train": {"lr": lr}, "hidden": "abc", "vocab": "def"}
    for name, lr in (("a", 0.001), ("b", 0.002))
}


def run_files(directory: Path, name: str) -> None:
    """A run's checkpoint folder: run.json, last.pt and best.pt with their checksums."""
    directory.mkdir(parents=True)
    run = {"checkpoint_format": CHECKPOINT_FORMAT, **RUNS[name]}
    (directory / "run.json").write_text(json.dumps(run))
    for f in ("last.pt", "best.pt"):
        (directory / f).write_bytes(f"{name} {f}".encode())
        (directory / f"{f}.sha256.json").write_text(f"{name} {f} sums")


def contents(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def killed_at(directory: Path, run: str, k: int) -> bool:
    """start_or_resume for `run` in a child process SIGKILLed at its k-th rename; whether the
    kill came (False: the child ran to its end first)."""

    def child() -> None:
        renames = 0
        for name in ("replace", "rename"):
            real = getattr(os, name)

            def counted(src, dst, *args, _real=real, **kwargs):
                nonlocal renames
                renames += 1
                if renames == k:
                    os.kill(os.getpid(), signal.SIGKILL)
                return _real(src, dst, *args, **kwargs)

            setattr(os, name, counted)
        start_or_resume(directory, RUNS[run])

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join()
    return proc.exitcode == -signal.SIGKILL


@pytest.mark.parametrize(
    "start, aside, run",
    [("a", None, "b"), ("a", "b", "b"), ("a", "b", "c")],
    ids=["aside", "back", "aside-replacing"],
)
def test_a_swap_killed_at_any_rename_ends_as_the_uninterrupted_one(tmp_path, start, aside, run):
    RUNS.setdefault("c", {"train": {"lr": 0.003}, "hidden": "abc", "vocab": "def"})
    initial = tmp_path / "initial"
    run_files(initial, start)
    if aside:
        run_files(initial / EARLIER, aside)
    want = tmp_path / "want"
    shutil.copytree(initial, want)
    start_or_resume(want, RUNS[run])
    expected = contents(want)
    k = 0
    while True:
        k += 1
        here = tmp_path / f"killed-{k}"
        shutil.copytree(initial, here)
        if not killed_at(here, run, k):
            break
        start_or_resume(here, RUNS[run])
        assert contents(here) == expected, f"killed at rename {k}"
        assert not any((here / name).exists() for name in OWN)
    assert k > 6  # the kills landed inside the swap, each rename of it
    assert not (want / JOURNAL).exists()
