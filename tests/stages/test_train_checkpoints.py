"""stages.train keeps a checkpoint directory only for the exact run that wrote it."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import yaml

from stages.drafter.training import LoopSettings
from stages.params.train import TrainParams
from stages.train import (
    CHECKPOINT_FORMAT,
    DERIVED_SETTINGS,
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


def test_the_loop_settings_are_the_train_keys_of_their_name():
    """Every loop setting is the train key of its name or one derived from the keys, so a knob the
    loop reads is one field in each, copied by name; a value set in params reaches the loop."""
    loop = {f.name for f in dataclasses.fields(LoopSettings)}
    keys = {f.name for f in dataclasses.fields(TrainParams)}
    assert loop - set(DERIVED_SETTINGS) <= keys
    p = TrainParams(lr=3e-3, length_window=5, fp8=True, max_steps=40, warmup_ratio=0.5)
    s = settings(p, train_samples=100)
    assert (s.lr, s.length_window, s.fp8, s.total_steps, s.warmup_steps) == (3e-3, 5, True, 40, 20)
    assert settings(TrainParams(compile=False), 100).compile is False


def test_speed_only_is_the_fields_own_word():
    assert {"device", "cpu_threads", "compile"} == SPEED_ONLY
