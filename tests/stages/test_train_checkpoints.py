"""stages.train keeps a checkpoint directory only for the exact run that wrote it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import yaml

from stages.drafter.knobs import LoopKnobs
from stages.params.train import TrainParams
from stages.train import (
    CHECKPOINT_FORMAT,
    EARLIER,
    SPEED_ONLY,
    run_identity,
    settings,
    start_or_resume,
)
from tests.conftest import ROOT

RUN = {"train": {"lr": 0.001}, "hidden": "abc", "vocab": "def"}


def checkpoints_of(tmp_path, run_json: dict):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    (directory / "last.pt").write_bytes(b"weights")
    (directory / "run.json").write_text(json.dumps(run_json))
    return directory


def test_the_same_run_resumes(tmp_path):
    directory = checkpoints_of(tmp_path, {"checkpoint_format": CHECKPOINT_FORMAT, **RUN})
    start_or_resume(directory, RUN)
    assert (directory / "last.pt").exists()


def test_a_checkpoint_of_an_older_format_starts_over(tmp_path, capsys):
    directory = checkpoints_of(tmp_path, RUN)  # written before the format was recorded
    start_or_resume(directory, RUN)
    assert not (directory / "last.pt").exists()
    assert (
        json.loads((directory / "run.json").read_text())["checkpoint_format"] == CHECKPOINT_FORMAT
    )
    assert "checkpoint format changed: starting over" in capsys.readouterr().out


def test_changed_params_start_over(tmp_path):
    directory = checkpoints_of(tmp_path, {"checkpoint_format": CHECKPOINT_FORMAT, **RUN})
    start_or_resume(directory, {**RUN, "train": {"lr": 0.002}})
    assert not (directory / "last.pt").exists()
    assert (directory / EARLIER / "last.pt").read_bytes() == b"weights"  # kept aside


def test_the_earlier_run_is_kept_until_a_changed_run_completes_and_comes_back(tmp_path):
    """A changed run that fails before its first checkpoint keeps the earlier one aside (a
    second change does not replace it with nothing); set back, the earlier run resumes; a run
    with checkpoints of its own is kept aside in turn."""
    first = {"checkpoint_format": CHECKPOINT_FORMAT, **RUN}
    directory = checkpoints_of(tmp_path, first)
    other, third = {**RUN, "train": {"lr": 0.002}}, {**RUN, "train": {"lr": 0.003}}
    start_or_resume(directory, other)  # ... and failed before its first checkpoint
    start_or_resume(directory, third)  # ... and failed too
    assert (directory / EARLIER / "last.pt").read_bytes() == b"weights"
    start_or_resume(directory, RUN)
    assert (directory / "last.pt").read_bytes() == b"weights" and not (directory / EARLIER).exists()
    assert json.loads((directory / "run.json").read_text()) == first
    start_or_resume(directory, other)
    (directory / "last.pt").write_bytes(b"other weights")  # its first checkpoint
    start_or_resume(directory, RUN)  # set back once more: the two swap
    assert (directory / "last.pt").read_bytes() == b"weights"
    assert (directory / EARLIER / "last.pt").read_bytes() == b"other weights"


def test_speed_only_params_resume_and_the_others_start_over(tmp_path):
    """Moving a run to another device, thread count or compiled step resumes it; any param that
    changes the drafter starts it over."""
    vocab = tmp_path / "vocab.safetensors"
    vocab.write_bytes(b"ids")
    base = TrainParams()
    identity = run_identity(base, "features", vocab)
    for speed in ({"device": "cuda:1"}, {"cpu_threads": 7}, {"compile": True}):
        assert run_identity(replace(base, **speed), "features", vocab) == identity, speed
    assert run_identity(replace(base, lr=base.lr * 2), "features", vocab) != identity
    assert run_identity(base, "other features", vocab) != identity


def test_the_params_that_rerun_the_stage_are_the_ones_that_restart_training():
    """dvc.yaml's train params (what `dvc repro` reruns the stage for) against TrainParams: every
    field but the speed-only ones, so a rerun never resumes a drafter trained otherwise."""
    stage = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["train"]
    declared = {p.removeprefix("train.") for p in stage["params"] if p.startswith("train.")}
    fields = {f.name for f in dataclasses.fields(TrainParams)}
    assert declared == fields - set(SPEED_ONLY)
    assert set(SPEED_ONLY) <= fields


def other_value(value):
    """A valid value of a knob other than its default."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return value / 2 if value else 0.5


def test_every_knob_set_in_params_reaches_the_loop():
    """Each of the loop's knobs is a train key (TrainParams inherits them), and a value set in
    params is the value the loop reads; the derived steps come from the stage's own keys."""
    changed = {f.name: other_value(f.default) for f in dataclasses.fields(LoopKnobs)}
    s = settings(TrainParams(**changed), train_samples=100)
    assert {name: getattr(s, name) for name in changed} == changed
    s = settings(TrainParams(max_steps=40, warmup_ratio=0.5), train_samples=100)
    assert (s.total_steps, s.warmup_steps, s.compile) == (40, 20, True)
    s = settings(TrainParams(batch_size=8, epochs=2.0, compile=False), train_samples=100)
    assert (s.total_steps, s.warmup_steps, s.compile) == (26, 1, False)


def test_speed_only_is_the_fields_own_word():
    assert {"device", "cpu_threads", "compile"} == SPEED_ONLY
