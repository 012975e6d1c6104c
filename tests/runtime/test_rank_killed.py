"""One torchrun rank SIGKILLed mid-run (2 CPU processes, gloo, the real stories260K target): the
other rank stops within seconds instead of waiting in a collective, torchrun exits non-zero naming
the dead rank, and the rerun, by 2 processes or by 1, ends with the outputs of an uninterrupted
run. A rank that hangs instead of dying is bounded by EAGLE_COLLECTIVE_TIMEOUT_S.

The victim is frozen (tests/stop_in_write.py, STOP_RANK) in a write of its own and killed there,
so every run loses the same work: extract's rank 1 in its first shard after rank 0 finished all of
its shards (rank 0 then waits at the last barrier), train's rank 0 (the one writing checkpoints)
in its second checkpoint while rank 1 waits in the next step's all-reduce.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from stages.runtime.parallel import TIMEOUT_ENV
from tests.conftest import STORIES_REL
from tests.procstat import frozen, running
from tests.runtime.test_distributed import (
    assert_same_curves,
    stage,
    stage_env,
    torchrun,
    train_args,
    write_merged,
    write_params,
    write_vocab,
    writes,
)
from tests.runtime.test_kill9 import (
    POLL_S,
    STOPPER,
    assert_killed_temps,
    extract_args,
    killed_temps,
    temps,
)

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.shared(STORIES_REL),
]
WORLD = 2
CHECKPOINT_EVERY = 2  # last.pt at steps 2, 4, 6: the kill in the second leaves step 2 to resume
# The most the other rank may take to stop after the kill. torchrun's agent notices a dead worker
# within its --monitor-interval (0.1 s), sends the others SIGTERM, which the stages do not catch,
# and SIGKILL 30 s later: a rank that outlived the SIGTERM would take those 30 s. Measured here:
# the other rank gone 0.2 s after the kill, torchrun 3.3 s after it.
STOP_BOUND_S = 20.0
HANG_TIMEOUT_S = 3  # EAGLE_COLLECTIVE_TIMEOUT_S of the hung-rank test


@dataclass
class Stopped:
    """A torchrun run whose frozen rank `victim` was killed."""

    output: str
    returncode: int
    victim: int  # the frozen worker's pid
    survivor_s: float  # from the kill until the other rank had ended


def workers(agent: int) -> list[int]:
    """The worker processes torchrun's agent `agent` started (none once it has ended)."""
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        return [
            int(pid)
            for task in Path(f"/proc/{agent}/task").iterdir()
            for pid in (task / "children").read_text().split()
        ]
    return []


@contextlib.contextmanager
def rank_frozen(
    module: str, args: list, cwd: Path, rank: int, pattern: Path, k: int, env: dict | None = None
) -> Iterator[tuple[subprocess.Popen, int, Path]]:
    """`module` under torchrun with rank `rank` frozen in its k-th write of a file matching
    `pattern`: (torchrun, the frozen worker's pid, the run's log). Whatever is left of the run is
    killed on the way out."""
    log = cwd / f"{module}-rank{rank}-frozen-{k}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*torchrun(WORLD, STOPPER), module, *map(str, args)],
            cwd=cwd,
            env=dict(
                stage_env(),
                STOP_AT=str(pattern),
                STOP_COUNT=str(k),
                STOP_RANK=str(rank),
                **(env or {}),
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        victim = None
        while victim is None:
            assert proc.poll() is None, f"{module} ended before the freeze:\n{log.read_text()}"
            victim = next((p for p in workers(proc.pid) if frozen(p)), None)
            time.sleep(POLL_S)
        yield proc, victim, log
    finally:
        if proc.poll() is None:
            for pid in [*workers(proc.pid), proc.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()


def ended_after(pids: list[int], start: float) -> float:
    """Seconds from `start` until every process in `pids` had ended (polled)."""
    while any(running(p) for p in pids):
        assert time.monotonic() - start < STOP_BOUND_S + 30, f"{pids} still running"
        time.sleep(POLL_S)
    return time.monotonic() - start


def kill_frozen(proc: subprocess.Popen, victim: int, log: Path) -> Stopped:
    """SIGKILL the frozen rank; how the rest of the run ended."""
    others = [p for p in workers(proc.pid) if p != victim]
    start = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    survivor_s = ended_after(others, start)
    returncode = proc.wait(timeout=STOP_BOUND_S)
    return Stopped(log.read_text(), returncode, victim, survivor_s)


def assert_stopped_naming_the_dead_rank(stopped: Stopped, rank: int) -> None:
    assert stopped.returncode != 0, stopped.output
    assert stopped.survivor_s < STOP_BOUND_S, stopped.output
    dead = rf"rank\s*: {rank} \(local_rank: {rank}\)\s*exitcode\s*: -9 \(pid: {stopped.victim}\)"
    assert re.search(dead, stopped.output), stopped.output  # torchrun's failure summary


def assert_same_files(out: Path, reference: Path) -> None:
    """Every file of `reference`, byte for byte, and no other (no temp file, no lock)."""
    names = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in out.iterdir()) == names
    for name in names:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Merged samples (12 shards), the vocabulary, params (a checkpoint every 2 steps) and the
    1-process features (hidden-1, which train_args reads)."""
    tmp = tmp_path_factory.mktemp("rank-killed")
    write_merged(tmp / "merged", n_train=16, n_eval=4)
    write_vocab(tmp / "vocab" / "d2t_t2d.safetensors")
    params = yaml.safe_load(write_params(tmp / "params.yaml").read_text())
    params["train"]["checkpoint_every"] = CHECKPOINT_EVERY
    (tmp / "params.yaml").write_text(yaml.safe_dump(params))
    stage("stages.extract", extract_args(tmp, "hidden-1"), tmp)
    return tmp


@pytest.fixture(scope="module")
def extract_killed(work) -> Stopped:
    """extract with rank 1 killed in its first shard once rank 0 has written all of its own."""
    out, shards = work / "hidden-killed", len(list((work / "hidden-1").glob("shard-*.safetensors")))
    rank0 = [out / f"shard-{k:05d}.safetensors.sha256.json" for k in range(0, shards, WORLD)]
    args = extract_args(work, "hidden-killed")
    with rank_frozen("stages.extract", args, work, 1, out / "shard-*.safetensors", 1) as run:
        while not all(p.exists() for p in rank0):
            assert run[0].poll() is None, run[2].read_text()
            time.sleep(POLL_S)
        return kill_frozen(*run)


def test_extract_rank_killed_the_other_stops(work, extract_killed):
    assert_stopped_naming_the_dead_rank(extract_killed, rank=1)
    out = work / "hidden-killed"
    shards = sorted(p.name for p in (work / "hidden-1").glob("shard-*.safetensors"))
    assert sorted(p.name for p in out.glob("shard-*.safetensors")) == shards[::WORLD]
    # the dead rank froze renaming one of its shards (its writer threads, extract.writers, finish
    # out of order under load: not always its first) and may have begun its others
    own, left = shards[1::WORLD], set(temps(out))
    frozen = [n for n in own if set(killed_temps(out / n, extract_killed.victim)) <= left]
    assert frozen, f"no shard's temp files left by the killed rank: {sorted(left)}"
    others = [n for n in own if n != frozen[0]]
    assert_killed_temps(out, frozen[0], others, extract_killed.victim)
    assert not (out / "index.parquet").exists()


@pytest.mark.parametrize("world", [WORLD, 1])
def test_extract_rerun_after_a_killed_rank(work, extract_killed, world):
    """The rerun extracts what the dead rank left, split over its processes, and ends with the
    1-process run's files byte for byte."""
    out = work / f"hidden-rerun-{world}"
    shutil.copytree(work / "hidden-killed", out)
    _, record = stage("stages.extract", extract_args(work, out.name), work, world)
    assert_same_files(out, work / "hidden-1")
    if record:  # the 6 shards rank 1 left: 3 for each rank, not all 6 again for rank 1
        for rank in range(WORLD):
            written = [p.name for p in writes(record, rank) if p.suffix == ".safetensors"]
            assert len(written) == 3, (rank, written)


@pytest.fixture(scope="module")
def train_reference(work) -> Path:
    """The reports of an uninterrupted 1-process training."""
    stage("stages.train", train_args(work, "ref"), work)
    return work / "reports-ref"


@pytest.fixture(scope="module")
def train_killed(work) -> Stopped:
    """train with rank 0 killed in its second checkpoint (step 4), rank 1 in an all-reduce."""
    last = work / "checkpoints-killed" / "last.pt"
    with rank_frozen("stages.train", train_args(work, "killed"), work, 0, last, 2) as run:
        return kill_frozen(*run)


def test_train_rank_killed_the_other_stops(work, train_killed):
    assert_stopped_naming_the_dead_rank(train_killed, rank=0)
    checkpoints = work / "checkpoints-killed"
    last = torch.load(checkpoints / "last.pt", weights_only=True)
    assert last["state"]["step"] == CHECKPOINT_EVERY
    assert temps(checkpoints) == killed_temps(checkpoints / "last.pt", train_killed.victim)
    assert not (work / "drafter-killed").exists()


@pytest.mark.parametrize("world", [WORLD, 1])
def test_train_rerun_after_a_killed_rank(work, train_killed, train_reference, world):
    """The rerun resumes at the last whole checkpoint, by 2 processes or 1, and its curves are the
    uninterrupted run's (as exact as a 2-process run is to a 1-process one)."""
    run = f"rerun-{world}"
    shutil.copytree(work / "checkpoints-killed", work / f"checkpoints-{run}")
    output, _ = stage("stages.train", train_args(work, run), work, world)
    assert f"resumed at step {CHECKPOINT_EVERY}" in output
    assert_same_curves(train_reference, work / f"reports-{run}")
    assert (work / f"drafter-{run}" / "model.safetensors").exists()


def test_a_hung_rank_is_bounded_by_the_collective_timeout(work):
    """Rank 0 frozen (not dead) in its first checkpoint: torchrun sees nothing wrong, so rank 1
    waits in the all-reduce for EAGLE_COLLECTIVE_TIMEOUT_S, then ends with one line saying so."""
    last = work / "checkpoints-hung" / "last.pt"
    env = {TIMEOUT_ENV: str(HANG_TIMEOUT_S)}
    args = train_args(work, "hung")
    with rank_frozen("stages.train", args, work, 0, last, 1, env) as (proc, victim, log):
        start = time.monotonic()
        survivor_s = ended_after([p for p in workers(proc.pid) if p != victim], start)
        # what torchrun does 30 s after its SIGTERM, which a stopped process leaves pending
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(timeout=STOP_BOUND_S) != 0
    output = log.read_text()
    assert HANG_TIMEOUT_S - 1 < survivor_s < HANG_TIMEOUT_S + STOP_BOUND_S, output
    assert (
        f"error: [Errno 103] rank 1 of {WORLD}: a collective failed (Timed out waiting "
        f"{HANG_TIMEOUT_S * 1000}ms for recv operation to complete): another rank died "
        f"(torchrun's failure summary names it) or gave no answer within {HANG_TIMEOUT_S} s "
        f"({TIMEOUT_ENV})"
    ) in output
