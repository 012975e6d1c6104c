"""kill -9 anywhere in generate, extract, train and train_dflash, each time followed by a rerun
that ends with the outputs of an uninterrupted run: a seeded sweep of kill points over each stage's
whole run.

tests/runtime/test_kill9.py kills each stage inside one seeded write. Here the stages run on the
demo target (greedy generation) in a temporary copy of the project with one small dataset, and
each is killed at KILL_SWEEP_POINTS points (3 in `make test`; `make kill-sweep` runs 21 and prints
where they landed). Point i of a stage draws frac(a seeded start + i x 0.618...), so any first n
points spread over the run, and the CI subset is the start of the full sweep:

- a time point (two points in three) is killed the drawn fraction of the uninterrupted run's time
  after the stage took its output lock (before it, a stage has only imported modules: nothing of
  its own to lose), scaled by this run's pace (its time to the lock against the uninterrupted
  run's: the machine's load varies); tests/freeze/sitecustomize.py first freezes it there and
  records where each of its threads stood;
- a write point (every third) is killed inside the drawn one of the files the uninterrupted run
  put in place (tests/dist_fixtures/record_writes.py lists them, tests/stop_in_write.py freezes
  the process in that rename);
- every ninth point, from the first, runs through `dvc repro -s <stage>`, killed with dvc's whole
  process group and rerun by `dvc repro -s` again; the others run the stage's command from
  dvc.yaml. A time point that the run outlives (a machine's load varies) is tried again with
  that run's time after its lock.

Where a kill landed (its phase): write (a temp file of the process in the outputs, or a thread
putting a file in place or removing one), compute (a thread in a forward pass, a training step or
an evaluation), loading (a thread importing modules or loading the target or tokenizer), between
(anywhere else: resume checks, reading inputs, batching, bookkeeping, compaction, export checks,
the interpreter's exit).

After the kill the outputs hold no temp file but the killed process's; after the rerun no temp
file and no lock anywhere, and against the uninterrupted run:
- generate: the same output ids per sample and turn, each stored once (one compacted part), and
  exactly the turns the kill had not saved generated again;
- replace: generate again over an earlier generation under another fingerprint (shorter
  replies); killed before its first turns landed, the earlier parts are there, unchanged and
  readable; the rerun ends as generate's uninterrupted run, the earlier data gone;
- extract: every file of data/hidden (shards, checksums, index.parquet, meta.json) bit for bit,
  and no shard that was in place at the kill extracted again;
- train: last.pt and best.pt weights, the export, the curves and train.json (all but timings)
  identical, every step once in the curve, resumed at the step of the last.pt the kill left;
- train_dflash: as train, over its own folders (models/dflash_checkpoints, models/dflash,
  train_dflash.json and curves), the checkpoints' anchor generator state identical too;
- swap: train again over an earlier run's checkpoints (other params), every point a write point
  inside the swap that keeps them aside (runtime/swap.py: the files moved, the journal): once the
  resume code has finished the swap the kill cut short, the earlier run is whole, in place or
  aside; the rerun ends as train's uninterrupted run.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from stages.artifacts.hidden import shard_files
from stages.artifacts.raw import part_facts, parts, read_raw
from stages.cli import run
from stages.runtime.files import checksum_problem
from stages.runtime.outputs import LOCK_NAME
from stages.runtime.swap import STAGING, finish_swap
from tests.conftest import ROOT
from tests.procstat import frozen, running
from tests.project import copy_project, ran_stages
from tests.reliability import leftovers, tree
from tests.runtime.test_distributed import RECORDER, stage_env, writes
from tests.runtime.test_kill9 import POLL_S, STOPPER

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow, pytest.mark.integration]
POINTS = int(os.environ.get("KILL_SWEEP_POINTS", "3"))
SEED = 114  # the first point of every stage falls mid-run: CI's kills reach the work too
GOLDEN = (math.sqrt(5) - 1) / 2  # the most evenly spreading step of frac(start + i x step)
DATASET = "sharegpt"
FREEZE_HOOK = Path(__file__).parents[1] / "freeze"
OUTPUT_ROOTS = ("data", "models", "reports")  # where the stages write, in the project
# what the frozen threads run, by function name (see the module docstring for the phases)
WRITING = {"atomic_path", "remove_with_checksum", "remove_stale_temps", "empty_dir"}
COMPUTING = {"_generate_batch", "capture_shard", "timed_rate", "training_step", "evaluate"}
LOADING = {"load_causal_lm", "target_tokenizer", "build_capture", "embedding_and_head"}
TRIES = 5  # runs of a time point that the run may outlive before it fails
PHASES = ("loading", "compute", "write", "between")  # in the table's order
RANKED = ("write", "compute", "loading", "between")  # a thread in an earlier one decides


def small(params: dict) -> None:
    """One dataset of 24 prompts, short greedy replies, several parts, shards and checkpoints."""
    params["datasets"] = {DATASET: params["datasets"][DATASET]}
    params["datasets"][DATASET]["prep"]["max_samples"] = 24
    params["generate"].update(batch_size=4, max_new_tokens=48, append_every=2)
    params["quality"].update(  # replies cut at 48 tokens: the gate lets them through
        max_truncated=1.0,
        min_reasoning_closed=0.0,
        min_tool_call_share=0.0,
        max_empty_reasoning=1.0,
    )
    params["merge"]["eval_fraction"] = 0.3
    params["extract"].update(shard_tokens=256, batch_tokens=512)
    for family in ("train", "dflash"):  # both families train, on the same features
        params[family].update(
            max_steps=20, eval_every=4, checkpoint_every=3, batch_size=2, cpu_threads=1
        )
    # fewer anchors than a sample's eligible ones: each batch draws its anchors, so a resume that
    # lost the anchor generator's state trains other weights (with all of them, no draw counts)
    params["dflash"]["num_anchors"] = 4


def command(name: str) -> list[str]:
    """Stage `name`'s cmd in dvc.yaml (a foreach stage's ${key} filled in): what dvc repro runs."""
    stage, _, key = name.partition("@")
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]
    return shlex.split((spec["do"] if key else spec)["cmd"].replace("${key}", key))


def run_env(**extra: str) -> dict[str, str]:
    """A stage's environment (one thread, no NCCL settings) with this venv's python and dvc first
    on PATH, for the stage's command and for dvc alike."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return dict(stage_env(), PATH=path, DVC_NO_ANALYTICS="1", **extra)


@dataclass
class Findings:
    """What a rerun got wrong against the uninterrupted run (empty: nothing)."""

    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.lost or self.duplicated or self.mismatched)


# What each stage's kill left that its rerun must keep, and the rerun's outputs checked against
# the uninterrupted run's (`reference`: a folder laid out as the project).


def generate_saved(project: Path) -> int:
    """The turns in the parts under their final names: the rerun keeps them all."""
    out = project / f"data/raw/{DATASET}"
    return read_raw(out).num_rows if out.exists() else 0


def generate_findings(project: Path, reference: Path, saved: int, output: str) -> Findings:
    found = Findings()
    out = project / f"data/raw/{DATASET}"
    files = parts(out)
    if len(files) != 1 or checksum_problem(files[0]):
        found.mismatched.append(f"parts {[f.name for f in files]}: one compacted part expected")
    got: dict[tuple, list] = {}
    for row in (r for f in files for r in pq.read_table(f).to_pylist()):
        key = (row["sample_id"], row["turn"])
        if key in got:
            found.duplicated.append(f"{key} stored twice")
        got[key] = row["output_ids"]
    want = {
        (r["sample_id"], r["turn"]): r["output_ids"]
        for r in read_raw(reference / f"data/raw/{DATASET}").to_pylist()
    }
    found.lost += [f"{key} missing" for key in sorted(want.keys() - got.keys())]
    found.mismatched += [
        f"{key}: other output ids" for key in want if key in got and got[key] != want[key]
    ]
    found.mismatched += [f"{key} not in the uninterrupted run" for key in got.keys() - want.keys()]
    new = rerun_new_turns(output)
    if new != len(want) - saved:
        found.duplicated.append(
            f"the rerun generated {new} turns; the kill had left "
            f"{len(want) - saved} of {len(want)} to generate"
        )
    return found


def rerun_new_turns(output: str) -> int | None:
    """The turns the rerun generated, from its closing figures (not the report: a rerun that
    generated nothing keeps the report of the killed run when that one had written it)."""
    found = re.findall(r"^\s+new_turns\s+([\d,]+)$", output, re.MULTILINE)
    return int(found[-1].replace(",", "")) if found else None


def extract_saved(project: Path) -> dict[str, int]:
    """The shards in place (each complete: renamed once written), by name: their mtimes."""
    return {p.name: p.stat().st_mtime_ns for p in shard_files(project / "data/hidden")}


def extract_findings(project: Path, reference: Path, kept: dict, output: str) -> Findings:
    found = Findings()
    out, want = project / "data/hidden", reference / "data/hidden"
    names = {p.name for p in out.iterdir()}
    wanted = {p.name for p in want.iterdir()}
    found.lost += [f"{name} missing" for name in sorted(wanted - names)]
    found.mismatched += [f"{name} not in the uninterrupted run" for name in sorted(names - wanted)]
    found.mismatched += [
        f"{name}: other bytes"
        for name in sorted(names & wanted)
        if (out / name).read_bytes() != (want / name).read_bytes()
    ]
    found.duplicated += [
        f"{name} extracted again"
        for name, mtime in kept.items()
        if (out / name).exists() and (out / name).stat().st_mtime_ns != mtime
    ]
    return found


@dataclass(frozen=True)
class Training:
    """A training stage of one drafter family, as the train stages' kill points see it: its name
    in dvc.yaml (its report's and curves' too), its checkpoint and export folders and its curves.
    `saved` and `findings` are its Stage's."""

    name: str
    checkpoints: str
    export: str
    curves: tuple[str, ...]  # reports/plots/<name>_<curve>.csv

    @property
    def report(self) -> str:
        return f"reports/{self.name}.json"

    @property
    def plots(self) -> tuple[str, ...]:
        return tuple(f"reports/plots/{self.name}_{c}.csv" for c in self.curves)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.checkpoints, self.export, self.report, *self.plots)

    def saved(self, project: Path) -> int | None:
        """The step of the last.pt in place (complete: renamed once written), the rerun's start."""
        last = project / self.checkpoints / "last.pt"
        return torch.load(last, weights_only=True)["state"]["step"] if last.exists() else None

    def findings(self, project: Path, reference: Path, step: int | None, output: str) -> Findings:
        found = Findings()
        for name in ("last.pt", "best.pt"):
            a, b = (
                torch.load(root / self.checkpoints / name, weights_only=True)
                for root in (reference, project)
            )
            # the weights, and the objective's own state where the checkpoint keeps it (last.pt:
            # DFlash's anchor generator; EAGLE-3's objective keeps none)
            for part, what in (("model", "weights"), ("objective", "objective state")):
                if (part in a) != (part in b) or not same_tensors(a.get(part, {}), b.get(part, {})):
                    found.mismatched.append(f"{self.checkpoints}/{name}: other {what}")
        exported = [p.relative_to(reference) for p in (reference / self.export).rglob("*")]
        for rel in [p for p in exported if (reference / p).is_file()] + list(map(Path, self.plots)):
            if not (project / rel).is_file():
                found.lost.append(f"{rel} missing")
            elif (project / rel).read_bytes() != (reference / rel).read_bytes():
                found.mismatched.append(f"{rel}: other bytes")
        report, want = (untimed(root / self.report) for root in (project, reference))
        if report != want:
            found.mismatched.append(
                f"{self.report}: {report} where the uninterrupted run has {want}"
            )
        steps, wanted = (self.curve_steps(root) for root in (project, reference))
        found.lost += [f"step {s} not in the curve" for s in sorted(set(wanted) - set(steps))]
        found.duplicated += [
            f"step {s} {n} times in the curve" for s, n in Counter(steps).items() if n > 1
        ]
        if step is not None and f"resumed at step {step}" not in output:
            found.mismatched.append(f"the rerun did not resume at step {step} of last.pt")
        return found

    def curve_steps(self, root: Path) -> list[int]:
        with open(root / f"reports/plots/{self.name}_loss.csv") as f:
            return [int(row["step"]) for row in csv.DictReader(f)]


EAGLE3 = Training("train", "models/checkpoints", "models/drafter", ("loss", "evals", "acceptance"))
DFLASH = Training(
    "train_dflash", "models/dflash_checkpoints", "models/dflash", ("loss", "evals", "accuracy")
)


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def untimed(report: Path) -> dict:
    """A report without its timings (keys ending in _s: seconds, per second; `seconds`)."""
    return {
        k: v
        for k, v in json.loads(report.read_text()).items()
        if not k.endswith("_s") and k != "seconds"
    }


EARLIER = Path(".sweep-earlier")  # in the project copy: the generation a replacement replaces


def earlier_fingerprints(project: Path) -> set[str]:
    return {fp for f in parts(project / EARLIER / "raw") for fp in part_facts(f)}


def replace_saved(project: Path) -> tuple[int, str | None]:
    """The turns the replacement had appended, and, when it had appended none, what of the
    earlier generation is not as it was (None: every part there, unchanged and readable)."""
    out = project / f"data/raw/{DATASET}"
    here = parts(out) if out.exists() else []
    old = earlier_fingerprints(project)
    new = [f for f in here if not set(part_facts(f)) <= old]
    if new:
        return sum(pq.read_metadata(f).num_rows for f in new), None
    earlier = {f.name: f.read_bytes() for f in parts(project / EARLIER / "raw")}
    if {f.name: f.read_bytes() for f in here} != earlier or any(map(checksum_problem, here)):
        return 0, f"before any new turn landed the earlier parts are {[f.name for f in here]}"
    return 0, None


def replace_findings(project: Path, reference: Path, saved: tuple, output: str) -> Findings:
    found = generate_findings(project, reference, saved[0], output)
    if saved[1]:
        found.lost.append(saved[1])
    return found


def put_earlier(project: Path) -> None:
    """data/raw/<dataset> as the earlier generation left it."""
    copy(project / EARLIER / "raw", project / f"data/raw/{DATASET}")


def earlier_generation(project: Path) -> None:
    """The dataset generated once with replies of another length: another fingerprint."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["generate"]["max_new_tokens"] = 32
    (project / EARLIER).mkdir()
    (project / EARLIER / "params.yaml").write_text(yaml.safe_dump(params))
    _, _, module, *args = command(f"generate@{DATASET}")
    args[args.index("--out") + 1] = str(EARLIER / "raw")
    args[args.index("--report") + 1] = str(EARLIER / "report.json")
    done = subprocess.run(
        [sys.executable, "-m", module, *args, "--params", str(EARLIER / "params.yaml")],
        cwd=project,
        env=run_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


EARLIER_RUN = Path(".sweep-earlier-run")  # in the project copy: the checkpoints a swap keeps aside


def earlier_run(project: Path) -> None:
    """Train's uninterrupted checkpoints as another run's (another lr in run.json)."""
    copy(project / EAGLE3.checkpoints, project / EARLIER_RUN)
    (project / EARLIER_RUN / LOCK_NAME).unlink(missing_ok=True)
    run = json.loads((project / EARLIER_RUN / "run.json").read_text())
    run["train"]["lr"] *= 2
    (project / EARLIER_RUN / "run.json").write_text(json.dumps(run))


def put_earlier_run(project: Path) -> None:
    copy(project / EARLIER_RUN, project / EAGLE3.checkpoints)


def swap_saved(project: Path) -> str | None:
    """What of the earlier run is not whole once the swap the kill cut short is finished, as the
    resume code finishes it (on a copy; None: every file of it, in place or aside)."""
    recovered = project.parent / f"{project.name}-swap-recovered"
    remove(recovered)
    copy(project / EAGLE3.checkpoints, recovered)
    finish_swap(recovered)
    want = {p.name: p.read_bytes() for p in (project / EARLIER_RUN).iterdir()}
    for where in (recovered, recovered / "earlier"):
        found = {n: (where / n).read_bytes() for n in want if (where / n).is_file()}
        if found == want:
            return None
    return f"the earlier run is not whole after the swap is finished: {tree(recovered)}"


def swap_findings(project: Path, reference: Path, saved: str | None, output: str) -> Findings:
    found = EAGLE3.findings(project, reference, None, output)
    if saved:
        found.lost.append(saved)
    return found


@dataclass(frozen=True)
class Stage:
    """A stage the sweep kills: its name in dvc.yaml, what it writes (removed before each run),
    the outputs of other stages it reads (put back as the uninterrupted runs left them), its
    output lock, and what the kill left that the rerun must keep, then the rerun's checks."""

    name: str
    outputs: tuple[str, ...]
    inputs: tuple[str, ...]
    lock: str
    saved: Callable[[Path], object]
    findings: Callable[[Path, Path, Any, str], Findings]
    setup: Callable[[Path], None] | None = None  # what the run starts from, after the reset
    writes_in: str | None = None  # every point a write point, among the writes under this name


STAGES = {
    "generate": Stage(
        f"generate@{DATASET}",
        (f"data/raw/{DATASET}", f"reports/generate/{DATASET}.json"),
        (),
        f"data/raw/{DATASET}/{LOCK_NAME}",
        generate_saved,
        generate_findings,
    ),
    "replace": Stage(
        f"generate@{DATASET}",
        (f"data/raw/{DATASET}", f"reports/generate/{DATASET}.json"),
        (),
        f"data/raw/{DATASET}/{LOCK_NAME}",
        replace_saved,
        replace_findings,
        put_earlier,
    ),
    "extract": Stage(
        "extract",
        ("data/hidden", "reports/extract.json"),
        (),
        f"data/hidden/{LOCK_NAME}",
        extract_saved,
        extract_findings,
    ),
    **{
        training.name: Stage(
            training.name,
            training.outputs,
            ("data/hidden",),
            f"{training.checkpoints}/{LOCK_NAME}",
            training.saved,
            training.findings,
        )
        for training in (EAGLE3, DFLASH)
    },
    "swap": Stage(
        EAGLE3.name,
        EAGLE3.outputs,
        ("data/hidden",),
        f"{EAGLE3.checkpoints}/{LOCK_NAME}",
        swap_saved,
        swap_findings,
        put_earlier_run,
        f"{EAGLE3.checkpoints}/{STAGING}",
    ),
}


@dataclass(frozen=True)
class KillPoint:
    stage: str
    index: int
    draw: float  # in [0, 1): the fraction of the run's time after its lock, or which write
    writes_only: bool = False  # every point a write point (a step of a few syscalls)

    @property
    def in_write(self) -> bool:
        return self.writes_only or self.index % 3 == 2

    @property
    def via_dvc(self) -> bool:
        # never a write point: dvc runs the stage's plain command
        return not self.writes_only and self.index % 9 == 0

    def __str__(self) -> str:
        how = ("dvc" if self.via_dvc else "cmd") + ("-write" if self.in_write else "-time")
        return f"{self.stage}-{self.index:02d}-{how}{self.draw:.3f}"


def kill_points(stage: str, n: int) -> list[KillPoint]:
    start = random.Random(f"{SEED}-{stage}").random()
    only = STAGES[stage].writes_in is not None
    return [KillPoint(stage, i, (start + i * GOLDEN) % 1, only) for i in range(n)]


@dataclass(frozen=True)
class RunTimes:
    """A run's seconds from its start to taking its output lock, and from there to its exit."""

    before_lock: float
    after_lock: float

    def kill_delay(self, draw: float, before_lock: float) -> float:
        """`draw` of the time after the lock, at the pace of a run that took `before_lock` to
        take it: the machine's load varies, and a run's imports are as slowed as the rest."""
        return draw * self.after_lock * before_lock / self.before_lock


@dataclass
class Reference:
    """A stage's uninterrupted run: the files it put in place, in order, and its times."""

    writes: list[Path]
    times: RunTimes


@dataclass
class Kill:
    """Where a kill landed and what it left: the output tree's temp files and locks."""

    pid: int
    phase: str
    where: str
    left: list[str]
    saved: object


@dataclass
class Outcome:
    point: KillPoint
    kill: Kill
    findings: Findings
    tries: int
    seconds: float


@dataclass
class Sweep:
    project: Path
    reference: Path  # the uninterrupted runs' outputs, laid out as the project
    logs: Path
    runs: dict[str, Reference]
    outcomes: list[Outcome] = field(default_factory=list)


def run_in_process(name: str) -> None:
    """Stage `name`'s command, run in this process with the project as working directory: the
    stages before the swept ones, whose outputs are only inputs here."""
    _, _, module, *args = command(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", [module, *args])
        run(importlib.import_module(module).main)


def lock_holder(lock: Path, proc: subprocess.Popen, log: Path) -> int:
    """Wait for the stage to take its output lock; its pid, which the lock file names."""
    while True:
        with contextlib.suppress(FileNotFoundError):
            if found := re.match(r"pid (\d+)", lock.read_text()):
                return int(found.group(1))
        assert proc.poll() is None, f"ended before taking {lock}:\n{log.read_text()}"
        time.sleep(POLL_S)


def reference_run(sweep: Sweep, stage: Stage) -> Reference:
    """The uninterrupted run, writes recorded; its outputs are kept aside as the reference."""
    record = sweep.logs / f"record-{stage.name}-{len(sweep.runs)}"  # generate's twice
    record.mkdir()
    log = sweep.logs / f"{stage.name}-reference.log"
    env = run_env(RECORD_DIR=str(record), RECORD_ROOT=str(sweep.project))
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(RECORDER), *command(stage.name)[2:]],
            cwd=sweep.project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    before_lock = age_s(lock_holder(sweep.project / stage.lock, proc, log))
    locked = time.monotonic()
    assert proc.wait() == 0, log.read_text()
    times = RunTimes(before_lock, time.monotonic() - locked)
    for rel in stage.outputs:
        copy(sweep.project / rel, sweep.reference / rel)
    written = writes(record, 0)
    if stage.writes_in:  # the journal's too: `.aside-swap.json` begins with the folder's name
        written = [w for w in written if str(w).startswith(str(sweep.project / stage.writes_in))]
        assert written, f"{stage.name} wrote nothing under {stage.writes_in}"
    return Reference(written, times)


def age_s(pid: int) -> float:
    """Seconds since process `pid` started (its start time in /proc/<pid>/stat, in clock ticks
    since boot): with dvc, the stage's own, not dvc's."""
    started = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - started / os.sysconf("SC_CLK_TCK")


def copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dst)


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def output_leftovers(project: Path) -> list[str]:
    return [f"{root}/{p}" for root in OUTPUT_ROOTS for p in leftovers(project / root)]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, demo_target, request):
    """The project copy with every stage's inputs, and the uninterrupted run of each swept stage
    (the stages between them run in this process); prints the table once the points are done."""
    started = time.monotonic()
    sweep = Sweep(
        copy_project(tmp_path_factory.mktemp("project"), small),
        tmp_path_factory.mktemp("reference"),
        tmp_path_factory.mktemp("logs"),
        {},
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sweep.project)
        run_in_process(f"prep@{DATASET}")
        sweep.runs["generate"] = reference_run(sweep, STAGES["generate"])
        for name in ("merge", "quality", "vocab"):
            run_in_process(name)
    for name in ("extract", "train", "train_dflash"):
        sweep.runs[name] = reference_run(sweep, STAGES[name])
    earlier_generation(sweep.project)
    reset(sweep, STAGES["replace"])
    sweep.runs["replace"] = reference_run(sweep, STAGES["replace"])  # outputs as generate's
    earlier_run(sweep.project)
    reset(sweep, STAGES["swap"])
    sweep.runs["swap"] = reference_run(sweep, STAGES["swap"])  # outputs as train's
    yield sweep
    if sweep.outcomes:  # printed past pytest's capture, as `capsys.disabled()` does
        with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
            print("\n" + table(sweep.outcomes, time.monotonic() - started))


class EndedFirst(Exception):
    """The run ended before its kill time; its times."""

    def __init__(self, times: RunTimes):
        super().__init__(f"ended {times.after_lock:.1f} s after taking its lock")
        self.times = times


def killed(sweep: Sweep, stage: Stage, point: KillPoint, times: RunTimes) -> Kill:
    """Run the stage (its command, or dvc repro), freeze it at `point` (a time point: its draw
    of the time after the lock, by `times` at this run's pace), see where it stands and what the
    tree holds, and SIGKILL it (with dvc: the whole process group). EndedFirst if the run ended
    before the freeze."""
    writes = sweep.runs[point.stage].writes
    stacks = sweep.logs / f"{point}-stacks.json"
    stacks.unlink(missing_ok=True)
    _, _, module, *args = command(stage.name)
    stopped = None  # a write point's file, renamed into place when the process was frozen
    if point.in_write:
        k = int(point.draw * len(writes))
        stopped = str(writes[k])
        cmd = [sys.executable, str(STOPPER), module, *args]
        env = run_env(STOP_AT=str(writes[k]), STOP_COUNT=str(writes[: k + 1].count(writes[k])))
    else:
        cmd = ["dvc", "repro", "-s", stage.name] if point.via_dvc else command(stage.name)
        env = run_env(
            PYTHONPATH=os.pathsep.join([str(FREEZE_HOOK), str(ROOT)]),
            FREEZE_MODULE=module,
            FREEZE_STACKS=str(stacks),
        )
    log = sweep.logs / f"{point}-killed.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=sweep.project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # with dvc: dvc, its shell and the stage, killed together
        )
    try:
        pid = lock_holder(sweep.project / stage.lock, proc, log)
        locked, before_lock = time.monotonic(), age_s(pid)
        if not point.in_write:
            kill_at = locked + times.kill_delay(point.draw, before_lock)
            while time.monotonic() < kill_at and running(pid):
                time.sleep(POLL_S)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        while not frozen(pid):
            if not running(pid):
                ended = RunTimes(before_lock, time.monotonic() - locked)
                assert proc.wait() == 0 and not point.in_write, log.read_text()
                raise EndedFirst(ended)
            if stacks.exists():  # stopping itself, or exiting, where it no longer can
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            time.sleep(POLL_S)
        temps = [p for p in tree(sweep.project) if p.rstrip("/").endswith(f".tmp-{pid}")]
        # a file moved whole (the checkpoint swap) leaves no temp file: the rename is the write
        phase, where = ("write", stopped) if stopped and not temps else landed(stacks, temps)
        return Kill(pid, phase, where, output_leftovers(sweep.project), stage.saved(sweep.project))
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone if it ended first
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def landed(stacks: Path, temps: list[str]) -> tuple[str, str]:
    """(phase, where): the killed process's temp files, else the phase of the thread that ranks
    first (write, compute, loading, between) with its innermost frame of the project's code."""
    if temps:
        return "write", ", ".join(temps)
    threads = json.loads(stacks.read_text())
    rank, name = min((RANKED.index(thread_phase(frames)), name) for name, frames in threads.items())
    return RANKED[rank], f"{name} {innermost(threads[name])}"


def thread_phase(frames: list) -> str:
    called = {function for _, _, function in frames}
    if called & WRITING:
        return "write"
    if called & COMPUTING:
        return "compute"
    if called & LOADING or any(file.startswith("<frozen importlib") for file, _, _ in frames):
        return "loading"
    return "between"


def innermost(frames: list) -> str:
    """The innermost frame in the project's stages/ code, as stages/<file>:<function>."""
    ours = [(f, fn) for f, _, fn in frames if f"{os.sep}stages{os.sep}" in f]
    if not ours:
        return frames[-1][2] if frames else "?"
    file, function = ours[-1]
    return f"{file[file.rindex(f'{os.sep}stages{os.sep}') + 1 :]}:{function}"


def rerun(sweep: Sweep, stage: Stage, point: KillPoint) -> str:
    """The rerun, as after a real kill: the same command, or `dvc repro -s` again; its output."""
    cmd = ["dvc", "repro", "-s", stage.name] if point.via_dvc else command(stage.name)
    proc = subprocess.run(cmd, cwd=sweep.project, env=run_env(), capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    if point.via_dvc:
        assert ran_stages(output) == {stage.name}, output
    return output


def reset(sweep: Sweep, stage: Stage) -> None:
    """Remove what the stage writes, and put back the other stages' outputs it reads."""
    for rel in stage.outputs:
        remove(sweep.project / rel)
    for rel in stage.inputs:
        remove(sweep.project / rel)
        copy(sweep.reference / rel, sweep.project / rel)
    if stage.setup:
        stage.setup(sweep.project)


POINT_PARAMS = [point for stage in STAGES for point in kill_points(stage, POINTS)]


@pytest.mark.parametrize("point", POINT_PARAMS, ids=str)
def test_killed_anywhere_the_rerun_ends_as_an_uninterrupted_run(sweep, point):
    stage = STAGES[point.stage]
    started = time.monotonic()
    times = sweep.runs[point.stage].times
    for tries in range(1, TRIES + 1):
        reset(sweep, stage)
        try:
            kill = killed(sweep, stage, point, times)
            break
        except EndedFirst as ended:  # faster than its pace said: that run's times, next
            assert tries < TRIES, f"{point}: the run ended before the kill {TRIES} times"
            times = ended.times
    findings = Findings()
    foreign = [p for p in kill.left if f".tmp-{kill.pid}" not in p and not p.endswith(LOCK_NAME)]
    findings.mismatched += [
        f"after the kill, a temp file not the killed process's: {p}" for p in foreign
    ]
    output = rerun(sweep, stage, point)
    found = stage.findings(sweep.project, sweep.reference, kill.saved, output)
    findings.lost += found.lost
    findings.duplicated += found.duplicated
    findings.mismatched += found.mismatched
    findings.mismatched += [f"left after the rerun: {p}" for p in output_leftovers(sweep.project)]
    sweep.outcomes.append(Outcome(point, kill, findings, tries, time.monotonic() - started))
    assert not findings, f"{point} (killed in {kill.phase}: {kill.where}): {findings}"


def table(outcomes: list[Outcome], seconds: float) -> str:
    """Each point (where its kill landed, what it left, what the rerun got wrong), then per
    stage: points, where the kills landed, losses, duplicates, mismatches, time."""
    lines = [f"kill sweep, seed {SEED}: every point killed, rerun and compared"]
    for o in outcomes:
        bad = len(o.findings.lost) + len(o.findings.duplicated) + len(o.findings.mismatched)
        lines.append(
            f"  {str(o.point):<34} {o.kill.phase:<8} {o.kill.where[:70]:<70} "
            f"left {len(o.kill.left)}  {'ok' if not bad else f'{bad} wrong'}  {o.seconds:5.0f} s"
            + (f"  (try {o.tries})" if o.tries > 1 else "")
        )
    header = ["stage", "points", "via dvc", *PHASES, "losses", "duplicates", "mismatches", "s"]
    rows = []
    for name, stage in STAGES.items():
        mine = [o for o in outcomes if o.point.stage == name]
        phases = Counter(o.kill.phase for o in mine)
        rows.append(
            [
                stage.name,
                len(mine),
                sum(o.point.via_dvc for o in mine),
                *(phases[p] for p in PHASES),
                sum(len(o.findings.lost) for o in mine),
                sum(len(o.findings.duplicated) for o in mine),
                sum(len(o.findings.mismatched) for o in mine),
                round(sum(o.seconds for o in mine)),
            ]
        )
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines += ["", markdown_row(header, widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [markdown_row(row, widths) for row in rows]
    lines.append(f"\n{len(outcomes)} points in {seconds:.0f} s (with the uninterrupted runs)")
    return "\n".join(lines)


def markdown_row(cells: list, widths: list[int]) -> str:
    return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths)) + " |"
