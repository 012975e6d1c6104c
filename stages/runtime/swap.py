"""A folder's files put aside into a subfolder, or swapped with those kept there, such that a
kill at any point leaves each set whole: the moves are written down first (a journal in the
folder), each step is safe to repeat, and the next start finishes what a killed one began
(finish_swap) before anything reads the folder. The subfolder is replaced, and removed, by one
rename each: never found half there."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .files import CHECKSUM_SUFFIX, remove_path, sync_dir, write_json

JOURNAL = ".aside-swap.json"  # the swap under way: which files, which way, how far
STAGING = ".aside-swap"  # the files going aside, until they replace the subfolder at once
DROPPED = ".aside-dropped"  # a subfolder on its way out, renamed there first
OWN = frozenset({JOURNAL, STAGING, DROPPED})  # never among the files a swap moves


def keep_aside(folder: Path, aside: Path, names: list[str], back: bool) -> None:
    """Move the files `names` of `folder` into the subfolder `aside`, replacing what it held, or,
    `back`, swap them with what it holds."""
    remove_path(folder / STAGING)
    remove_path(folder / DROPPED)
    kept = sorted(p.name for p in aside.iterdir()) if back and aside.is_dir() else []
    plan = {"aside": aside.name, "here": names, "back": kept, "phase": "out"}
    write_json(plan, folder / JOURNAL)
    finish_swap(folder)


def finish_swap(folder: Path) -> None:
    """Complete the swap a killed process began, from the step its journal names (`out`: the
    files going aside into the staging folder; `in`: those aside into `folder`; then the staging
    folder in place of the subfolder); nothing but a leftover removal when there is none."""
    journal = folder / JOURNAL
    if journal.exists():
        plan = json.loads(journal.read_text())
        aside, staging = folder / plan["aside"], folder / STAGING
        if plan["phase"] == "out":
            staging.mkdir(exist_ok=True)
            _move(plan["here"], folder, staging, leaving=True)
            plan = _reached(journal, plan, "in")
        if plan["phase"] == "in":
            _move(plan["back"], aside, folder, leaving=False)
            plan = _reached(journal, plan, "aside")
        if staging.exists():
            remove_path(folder / DROPPED)
            if aside.exists():
                aside.rename(folder / DROPPED)
            staging.rename(aside)
            sync_dir(folder)
        if aside.is_dir() and not any(aside.iterdir()):
            aside.rmdir()  # nothing was here to go aside
        journal.unlink()
        sync_dir(folder)
    remove_path(folder / DROPPED)


def drop_aside(folder: Path, aside: Path) -> None:
    """Remove the subfolder `aside`: renamed out of the way first, so that a kill while it is
    being removed leaves none of it under its name."""
    remove_path(folder / DROPPED)
    if aside.exists():
        aside.rename(folder / DROPPED)
        sync_dir(folder)
    remove_path(folder / DROPPED)


def _move(names: list[str], source: Path, dest: Path, leaving: bool) -> None:
    """Each of `names` still in `source` moved to `dest` (one moved before a kill is not there).
    A checksum never stays in the folder, or comes into it, without its file: it leaves before
    its file (`leaving`) and comes after it, since the stage's cleanup before the swap is finished
    (remove_stale_temps) removes a checksum found there alone."""
    for name in sorted(names, key=lambda n: n.endswith(CHECKSUM_SUFFIX) != leaving):
        if (source / name).exists():
            os.replace(source / name, dest / name)
    sync_dir(source)
    sync_dir(dest)


def _reached(journal: Path, plan: dict, phase: str) -> dict:
    plan = {**plan, "phase": phase}
    write_json(plan, journal)
    return plan
