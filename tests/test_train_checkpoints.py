"""stages.train keeps a checkpoint directory only for the exact run that wrote it."""

from __future__ import annotations

import json

from stages.train import CHECKPOINT_FORMAT, start_or_resume

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
