"""A training run's checkpoint folder: its checkpoints are kept only for the exact run that wrote
them (params, inputs, checkpoint format); another run's wait aside until this one completes, and
come back when the params are set back. Shared by every drafter's stage (the folder holds what
training.py's `checkpoint` writes)."""

from __future__ import annotations

import json
from pathlib import Path

from ..runtime.files import remove_path, write_json
from ..runtime.outputs import LOCK_NAME, remove_stale_temps
from ..runtime.swap import OWN, finish_swap, keep_aside

# What a checkpoint holds; raise it when that changes (2: evaluations carry replayed_tau; 3:
# a size and sha256 beside each; 4: the best acceptance as `best_tau`, the objective's own state),
# so that older checkpoints start the run over instead of failing to resume.
CHECKPOINT_FORMAT = 4
# Formats `resume` (training.py) reads as this one: 3 holds the best acceptance as
# `best_replayed_tau` and no objective state (EAGLE-3's has none), so its runs resume.
READABLE_FORMATS = (3,)


EARLIER = "earlier"  # in the checkpoint folder: another run's checkpoints, kept aside


def start_or_resume(checkpoint_dir: Path, run: dict, stage: str = "train") -> None:
    """Keep checkpoints only when they belong to this exact run (`run`: its params and inputs) and
    were written in this checkpoint format; drop what a killed run left half-written. Another
    run's checkpoints are kept aside in `earlier/` until this run completes (a run that fails
    leaves them), and come back when the params are set back to theirs. A swap that a kill cut
    short is finished first, so each run's checkpoints are whole again."""
    run = {"checkpoint_format": CHECKPOINT_FORMAT, **run}
    remove_stale_temps(checkpoint_dir)  # a killed run's half-saved checkpoint or journal
    finish_swap(checkpoint_dir)
    run_file, aside = checkpoint_dir / "run.json", checkpoint_dir / EARLIER
    if run_file.exists() and not _same_run(run_file, run):
        if _same_run(aside / "run.json", run):
            print(f"[{stage}] the params are the earlier run's again: resuming it from {aside}")
            _keep_aside(checkpoint_dir, aside, back=True)
        else:
            print(
                f"[{stage}] params, features, inputs or checkpoint format changed: starting over "
                f"in {checkpoint_dir}, the earlier checkpoints kept in {aside} until this run "
                f"completes"
            )
            _keep_aside(checkpoint_dir, aside, back=False)
    write_json(run, run_file)


def _same_run(run_file: Path, run: dict) -> bool:
    """Whether the checkpoints of `run_file` are `run`'s, in this format or one read as it."""
    if not run_file.exists():
        return False
    recorded = json.loads(run_file.read_text())
    if recorded.get("checkpoint_format") in READABLE_FORMATS:
        recorded["checkpoint_format"] = CHECKPOINT_FORMAT
    return recorded == json.loads(json.dumps(run))


def _keep_aside(checkpoint_dir: Path, aside: Path, back: bool) -> None:
    """Put the folder's run aside (replacing one kept there), or, `back`, swap it with the one
    aside, journaled (runtime/swap.py): a kill at any point of it leaves both runs to resume. A
    run with no checkpoint yet (it failed before its first) has nothing to keep: it is dropped,
    and a run already aside stays there."""
    skip = {LOCK_NAME, EARLIER, *OWN}
    here = [p for p in checkpoint_dir.iterdir() if p.name not in skip]
    if not any(p.suffix == ".pt" for p in here):
        for p in here:
            remove_path(p)
        here = []
    if here or back:
        keep_aside(checkpoint_dir, aside, [p.name for p in here], back)
