"""kill -9 at seeded points of the real generate, extract and train processes (stories260K), then
a rerun: nothing lost, nothing duplicated, the outputs of an uninterrupted run bit for bit.

The in-process resume tests stop a stage with KeyboardInterrupt, which still runs `finally` and
every context manager; a SIGKILL runs nothing. Each kill lands inside the seeded k-th write of a
raw part, shard or checkpoint (tests/stop_in_write.py freezes the process there), where it leaves
the most behind: the complete files before it and a temp file named after the dead process, which
the rerun must remove (DVC would hash it into the output) while a running writer's stays.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from stages.artifacts.raw import parts, read_raw
from stages.params.extract import ExtractParams
from stages.runtime.files import checksum_path, checksum_problem, temp_path
from stages.runtime.outputs import remove_stale_temps
from tests.conftest import ROOT, STORIES_REL
from tests.procstat import frozen
from tests.reliability import leftovers
from tests.runtime.test_distributed import (
    stage,
    stage_env,
    train_args,
    write_merged,
    write_params,
    write_vocab,
)
from tests.stages.test_generate import outputs, prompts  # noqa: F401 (prompts: a fixture)

pytestmark = pytest.mark.timeout(120)
SEED = 9
POLL_S = 0.002
STOPPER = Path(__file__).parents[1] / "stop_in_write.py"
TRAIN_STEPS, CHECKPOINT_EVERY = 30, 3


def kill_in_write(module: str, args: list, cwd: Path, pattern: Path, k: int) -> int:
    """Run `python -m module args` and SIGKILL it in its k-th write of a file matching `pattern`
    (tests/stop_in_write.py freezes it there); its pid. Fails if the stage ended first."""
    log = cwd / f"{module}-killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(STOPPER), module, *map(str, args)],
            cwd=cwd,
            env=dict(stage_env(), STOP_AT=str(pattern), STOP_COUNT=str(k)),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    while proc.poll() is None and not frozen(proc.pid):
        time.sleep(POLL_S)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, f"{module} ended before the kill:\n{log.read_text()}"
    return proc.pid


def temps(directory: Path) -> list[Path]:
    return sorted(directory.glob(".*.tmp-*"))


def assert_kill_left(
    directory: Path, pattern: str, complete: int, pid: int, writers: int = 1
) -> None:
    """The kill left `complete` whole files matching `pattern`, each with its checksum, and the
    killed process's temp files of one file it was renaming (the file and its recorded
    checksum). With several writer threads the files need not finish in order: the whole ones
    are among the first `complete + writers`, and the other writers may have begun the files
    not yet whole among those (their temp files, nothing else). As at most `writers` files are
    in flight, the first `complete - writers + 1` are whole (with one writer: exactly the first
    `complete`, in order)."""
    names = [pattern.replace("*", f"{i:05d}") for i in range(complete + writers)]
    whole = sorted(p.name for p in directory.glob(pattern))
    assert len(whole) == complete and set(whole) <= set(names), whole
    assert set(names[: max(0, complete - writers + 1)]) <= set(whole), whole
    assert all(checksum_problem(directory / name) is None for name in whole)
    pending = [name for name in names if name not in whole]
    left = set(temps(directory))
    frozen = [n for n in pending if set(killed_temps(directory / n, pid)) <= left]
    assert frozen, f"no file's temp files left by the killed process: {sorted(left)}"
    assert_killed_temps(directory, frozen[0], [n for n in pending if n != frozen[0]], pid)


def assert_killed_temps(directory: Path, frozen: str, later: list[str], pid: int) -> None:
    """The temp files process `pid` left: those of `frozen` (killed in its rename), and of the
    `later` files its other writer threads may have begun; nothing else."""
    left = set(temps(directory))
    frozen_temps = set(killed_temps(directory / frozen, pid))
    later_temps = {temp for name in later for temp in killed_temps(directory / name, pid)}
    assert frozen_temps <= left and left - frozen_temps <= later_temps, sorted(left)


def killed_temps(final: Path, pid: int) -> list[Path]:
    """The temp files process `pid` had open when killed in the rename of `final`."""
    return sorted([temp_path(final, pid), temp_path(checksum_path(final), pid)])


def running_writers_temp(directory: Path) -> Path:
    """A temp file of a running process (this one), standing for another torchrun rank's."""
    live = temp_path(directory / "shard-99999.safetensors", os.getpid())
    live.write_bytes(b"half")
    return live


def assert_only_running_temp(directory: Path, live: Path) -> None:
    assert temps(directory) == [live], "the rerun kept a dead writer's temp file or lost a live one"
    live.unlink()


def test_remove_stale_temps_keeps_a_running_writers(tmp_path):
    finished = subprocess.Popen([sys.executable, "-c", ""])
    finished.wait()
    dead_file, dead_dir = (temp_path(tmp_path / n, finished.pid) for n in ("a.parquet", "drafter"))
    live = temp_path(tmp_path / "b.parquet", os.getpid())
    for path in (dead_file, live, tmp_path / "c.parquet", tmp_path / ".gitignore"):
        path.write_bytes(b"x")
    (dead_dir / "model.safetensors").parent.mkdir()
    (dead_dir / "model.safetensors").write_bytes(b"x")
    assert sorted(remove_stale_temps(tmp_path)) == sorted([dead_file, dead_dir])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, "c.parquet", ".gitignore"]
    )
    assert remove_stale_temps(tmp_path / "missing") == []


KILLED_IN_A_SHARD_WRITE = """
import os, signal, sys, torch
from pathlib import Path
from stages.runtime import files, tensor_file
from stages.params.extract import ExtractParams

class KilledMidway:  # the shard's file, as a kill -9 finds it: a header and some data written
    def __init__(self, out):
        self.out, self.writes = out, 0
    def write(self, data):
        self.writes += 1
        if self.writes == 4:
            self.out.out.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return self.out.write(data)

tensor_file.WRITE_CHUNK = 16
with files.atomic_file(Path(sys.argv[1]) / "shard-00000.safetensors") as out:
    tensor_file.save_safetensors({"x": torch.zeros(64)}, KilledMidway(out))
"""


@pytest.mark.slow
def test_a_process_killed_in_a_shard_write_leaves_only_its_own_temp(tmp_path):
    """A shard is written straight to its temp name: what a kill leaves there is half a file
    under the process's temp name, which the next run's cleanup removes."""
    killed = subprocess.Popen(
        [sys.executable, "-c", KILLED_IN_A_SHARD_WRITE, str(tmp_path)], cwd=ROOT
    )
    assert killed.wait() == -signal.SIGKILL
    left = list(tmp_path.iterdir())
    assert [p.name for p in left] == [f".shard-00000.safetensors.tmp-{killed.pid}"]
    assert 8 < left[0].stat().st_size < 8 + 64 * 4  # a header and part of the data
    remove_stale_temps(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Merged samples, the vocabulary, params for all three stages and the reference features
    (hidden-1, where train_args looks for them)."""
    tmp = tmp_path_factory.mktemp("kill9")
    write_merged(tmp / "merged", n_train=16, n_eval=4)
    write_vocab(tmp / "vocab" / "d2t_t2d.safetensors")
    params = yaml.safe_load(write_params(tmp / "params.yaml").read_text())
    params["target"]["chat_template"] = str(ROOT / "tests/fixtures/stories_chat_template.jinja")
    params["generate"] = {"max_new_tokens": 24, "batch_size": 2, "append_every": 1}
    params["datasets"] = {"d": {"prep": {"format": "sharegpt", "path": "unused"}}}
    params["train"].update(max_steps=TRAIN_STEPS, checkpoint_every=CHECKPOINT_EVERY)
    (tmp / "params.yaml").write_text(yaml.safe_dump(params))
    stage("stages.extract", extract_args(tmp, "hidden-1"), tmp)
    return tmp


def generate_args(tmp: Path, run: str) -> list:
    return [
        "d",
        "--params",
        tmp / "params.yaml",
        "--prompts",
        tmp / "prompts" / "d.parquet",
        "--out",
        tmp / f"raw-{run}" / "d",
        "--report",
        tmp / f"reports-{run}" / "d.json",
    ]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.shared(STORIES_REL)
def test_generate_killed_then_rerun(work, prompts):  # noqa: F811
    (work / "prompts").mkdir(exist_ok=True)
    shutil.copyfile(prompts, work / "prompts" / "d.parquet")
    stage("stages.generate", generate_args(work, "ref"), work)
    out = work / "raw-killed" / "d"
    k = random.Random(f"{SEED}-generate").randint(2, 9)  # 8 parts, one a reply; 9: compaction
    pid = kill_in_write(
        "stages.generate", generate_args(work, "killed"), work, out / "part-*.parquet", k
    )
    assert_kill_left(out, "part-*.parquet", k - 1, pid)
    assert len(read_raw(out)) == k - 1
    live = running_writers_temp(out)
    stage("stages.generate", generate_args(work, "killed"), work)
    assert_only_running_temp(out, live)
    report = json.loads((work / "reports-killed" / "d.json").read_text())
    assert (report["samples"], report["new_samples"]) == (8, 8 - (k - 1))
    table = read_raw(out)
    assert table.num_rows == len(set(table.column("sample_id").to_pylist())) == 8
    assert len(parts(out)) == 1
    assert outputs(out) == outputs(work / "raw-ref" / "d")


def extract_args(tmp: Path, out: str) -> list:
    return [
        "--params",
        tmp / "params.yaml",
        "--merged",
        tmp / "merged",
        "--out",
        tmp / out,
        "--report",
        tmp / f"{out}.json",
    ]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.shared(STORIES_REL)
def test_extract_killed_then_rerun(work):
    ref, out = work / "hidden-1", work / "hidden-killed"
    shards = sorted(p.name for p in ref.glob("shard-*.safetensors"))
    k = random.Random(f"{SEED}-extract").randint(2, len(shards))
    pid = kill_in_write(
        "stages.extract", extract_args(work, "hidden-killed"), work, out / "shard-*.safetensors", k
    )
    extract = ExtractParams.read(work / "params.yaml")
    assert_kill_left(out, "shard-*.safetensors", k - 1, pid, extract.writers)
    assert not (out / "index.parquet").exists()
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.safetensors")}
    live = running_writers_temp(out)
    stage("stages.extract", extract_args(work, "hidden-killed"), work)
    assert_only_running_temp(out, live)
    assert {n: (out / n).stat().st_mtime_ns for n in kept} == kept  # not extracted twice
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in ref.iterdir())
    for name in shards + ["index.parquet", "meta.json"]:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.shared(STORIES_REL)
def test_train_killed_then_rerun(work):
    stage("stages.train", train_args(work, "ref"), work)
    checkpoints = work / "checkpoints-killed"
    k = random.Random(f"{SEED}-train").randint(2, TRAIN_STEPS // CHECKPOINT_EVERY)
    pid = kill_in_write(
        "stages.train", train_args(work, "killed"), work, checkpoints / "last.pt", k
    )
    assert temps(checkpoints) == killed_temps(checkpoints / "last.pt", pid)
    step = torch.load(checkpoints / "last.pt", weights_only=True)["state"]["step"]
    assert step == CHECKPOINT_EVERY * (k - 1) and not (work / "drafter-killed").exists()
    live = running_writers_temp(checkpoints)
    output, _ = stage("stages.train", train_args(work, "killed"), work)
    assert_only_running_temp(checkpoints, live)
    assert f"resumed at step {step}" in output
    for name in ("last.pt", "best.pt"):
        a, b = (
            torch.load(work / f"checkpoints-{run}" / name, weights_only=True)["model"]
            for run in ("ref", "killed")
        )
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), name
    for name in (
        "drafter-{}/model.safetensors",
        "reports-{}/plots/train_loss.csv",
        "reports-{}/plots/train_acceptance.csv",
    ):
        assert (work / name.format("killed")).read_bytes() == (
            work / name.format("ref")
        ).read_bytes(), name
    ref, resumed = (
        json.loads((work / f"reports-{run}" / "train.json").read_text())
        for run in ("ref", "killed")
    )
    timings = {"tokens_per_s": 0, "warmup_s": 0}  # seconds of this machine, not results
    assert {**ref, **timings} == {**resumed, **timings}


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.shared(STORIES_REL)
@pytest.mark.parametrize(
    "module, output",
    [
        ("stages.train", "drafter-{run}"),  # the export: models/.drafter.tmp-<pid>/
        ("stages.train", "reports-{run}/train.json"),
        ("stages.generate", "reports-{run}/d.json"),
    ],
)
def test_killed_in_any_output_the_rerun_leaves_no_temp_file(work, prompts, module, output):  # noqa: F811
    """kill -9 inside the write of the export and of the reports (the outputs besides shards,
    parts and checkpoints): the tree then holds the killed writer's temp files and its folder
    lock; the rerun removes them and completes; the tree then holds neither, anywhere."""
    (work / "prompts").mkdir(exist_ok=True)
    shutil.copyfile(prompts, work / "prompts" / "d.parquet")
    run = f"{module.split('.')[1]}-{Path(output).stem.split('-')[0]}"
    final = work / output.format(run=run)
    args = train_args(work, run) if module == "stages.train" else generate_args(work, run)
    pid = kill_in_write(module, args, work, final, 1)
    mine = [p for p in leftovers(work) if run in p]  # the tree's temp files and locks
    temp = str(temp_path(final, pid).relative_to(work))
    assert temp in [p.rstrip("/") for p in mine], mine
    if module == "stages.train":  # the whole run holds the checkpoint folder's lock
        assert f"checkpoints-{run}/.stage.lock" in mine
    assert not final.exists()
    stage(module, args, work)
    assert final.exists()
    assert leftovers(work) == []
