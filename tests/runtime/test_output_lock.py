"""Two processes writing one output folder: the second is refused with the first one's pid
(`<folder>/.stage.lock`, an flock the kernel drops when its holder dies, so a killed holder's lock
is taken over by the next run); two `dvc repro` at once: DVC's own repository lock refuses the
second."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stages import extract, generate, merge, train
from stages.runtime.outputs import OutputLocked, output_lock
from tests.conftest import ROOT
from tests.procstat import frozen
from tests.project import copy_project, sh
from tests.reliability import (
    extract_args,
    extracted_run,
    generate_args,
    generated_run,
    leftovers,
    merge_args,
    outputs,
    shared_run,
    train_args,
)
from tests.runtime.test_distributed import stage_env
from tests.stage_runner import run_stage

STOPPER = Path(__file__).parents[1] / "stop_in_write.py"


def test_a_second_holder_is_refused_and_the_lock_goes_with_its_holder(tmp_path):
    folder = tmp_path / "out"
    with output_lock(folder, "generate d") as lock:
        assert lock == folder / ".stage.lock"
        assert lock.read_text() == f"pid {os.getpid()}, generate d\n"
        with pytest.raises(OutputLocked) as err, output_lock(folder, "again"):
            pass
        assert str(err.value) == (
            f"{folder} is being written by another process (pid {os.getpid()}, generate d, "
            f"lock {lock}); wait for it to finish or stop it, then rerun"
        )
        assert lock.exists()
    assert not folder.exists()  # created for the run, left empty: removed with the lock
    folder.mkdir()
    (folder / "kept").write_text("x")
    with output_lock(folder):
        pass
    assert sorted(p.name for p in folder.iterdir()) == ["kept"]


def test_a_dead_holders_lock_is_taken_over(tmp_path, capsys):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / ".stage.lock").write_text("pid 999999999, generate d\n")  # no process holds it
    with output_lock(folder, "extract"):
        assert (folder / ".stage.lock").read_text() == f"pid {os.getpid()}, extract\n"
    assert "took over the lock of a process that is gone (pid 999999999, generate d)" in (
        capsys.readouterr().out
    )
    assert list(folder.iterdir()) == []


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return shared_run(tmp_path_factory, "generated", generated_run)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    return shared_run(tmp_path_factory, "extracted", extracted_run)


@pytest.mark.parametrize("stage", ["generate", "merge", "extract", "train"])
def test_every_folder_writing_stage_refuses_a_held_folder(
    tmp_path, generated, extracted, monkeypatch, capsys, stage
):
    params = generated / "params.yaml"
    main, args, folder = {
        "generate": (generate.main, generate_args(generated, params), generated / "data/raw/d"),
        "merge": (merge.main, merge_args(generated, params), generated / "data/merged"),
        "extract": (extract.main, extract_args(extracted, "hidden"), extracted / "hidden"),
        "train": (train.main, train_args(extracted, "hidden"), extracted / "checkpoints"),
    }[stage]
    before = sorted(p.name for p in folder.iterdir()) if folder.exists() else None
    with output_lock(folder, "the test"):
        code, _, err = run_stage(main, args, monkeypatch, capsys)
    assert code == 1, err
    assert err.strip().splitlines()[-1] == (
        f"error: {folder} is being written by another process (pid {os.getpid()}, the test, "
        f"lock {folder / '.stage.lock'}); wait for it to finish or stop it, then rerun"
    )
    after = sorted(p.name for p in folder.iterdir()) if folder.exists() else None
    assert after == before  # nothing written, nothing removed


@pytest.mark.slow
@pytest.mark.integration
def test_two_generate_processes_on_one_folder(tmp_path, generated):
    """The first generate is frozen in its first raw part's write (holding the lock); a second
    one into the same folder is refused naming it; after the first is killed -9, a rerun takes
    its lock over and completes with the outputs of an uninterrupted run."""
    params = tmp_path / "params.yaml"
    params.write_text((generated / "params.yaml").read_text())
    (tmp_path / "data/prompts").mkdir(parents=True)
    (tmp_path / "data/prompts/d.parquet").write_bytes(
        (generated / "data/prompts/d.parquet").read_bytes()
    )
    args = [str(a) for a in generate_args(tmp_path, params)]
    raw = tmp_path / "data/raw/d"
    env = dict(stage_env(), STOP_AT=str(raw / "part-*.parquet"), STOP_COUNT="1")
    first = subprocess.Popen(
        [sys.executable, str(STOPPER), "stages.generate", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and not frozen(first.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert frozen(first.pid), "the first generate never reached its first write"
        second = subprocess.run(
            [sys.executable, "-m", "stages.generate", *args],
            cwd=ROOT,
            env=stage_env(),
            capture_output=True,
            text=True,
        )
        assert second.returncode == 1, second.stderr
        assert second.stderr.strip().splitlines()[-1] == (
            f"error: {raw} is being written by another process (pid {first.pid}, generate d, "
            f"lock {raw / '.stage.lock'}); wait for it to finish or stop it, then rerun"
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert (raw / ".stage.lock").exists()  # a kill -9 removes nothing
    third = subprocess.run(
        [sys.executable, "-m", "stages.generate", *args],
        cwd=ROOT,
        env=stage_env(),
        capture_output=True,
        text=True,
    )
    assert third.returncode == 0, third.stderr
    assert f"took over the lock of a process that is gone (pid {first.pid}, generate d)" in (
        third.stdout
    )
    assert outputs(raw) == outputs(generated / "data/raw/d")
    assert leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.integration
def test_two_dvc_repro_at_once_the_second_is_refused_by_dvc(tmp_path):
    def small(params):
        params["datasets"] = {"sharegpt": params["datasets"]["sharegpt"]}
        params["datasets"]["sharegpt"]["prep"]["max_samples"] = 8

    repo = copy_project(tmp_path / "repo", small)
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        first = subprocess.Popen(
            ["dvc", "repro"],
            cwd=repo,
            env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its stage processes with it, in one group to stop
        )
    try:
        deadline = time.monotonic() + 120
        while "Running stage" not in log.read_text() and time.monotonic() < deadline:
            assert first.poll() is None, log.read_text()
            time.sleep(0.1)
        second = sh(["dvc", "repro"], repo, check=False)
        assert first.poll() is None, "the first dvc repro ended before the second one started"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    refused = second.stdout + second.stderr
    assert second.returncode != 0, refused
    # DVC's read/write lock on the outputs of the stage in progress (`.dvc/tmp/rwlock`), naming
    # the first dvc's pid; DVC's whole-repository lock words it "Unable to acquire lock"
    assert (
        re.search(rf"is busy, it is being blocked by:\s+\(PID {first.pid}\): ", refused)
        or "Unable to acquire lock" in refused
    ), refused
    assert "Running stage" not in refused
