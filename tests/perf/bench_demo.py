"""The demo end to end in this tree's commit beside another commit, on one machine, in one call:
the whole `dvc repro` (wall seconds), a no-op `dvc repro`, each stage's start-up (importing its
module and parsing its command line: `python -m stages.<stage> --help`, the part of a stage's run
before its first line of work), and whether the two commits' outputs are the same bytes.

    python -m tests.perf.bench_demo --base fb2b1c5            # the whole demo, twice (minutes)
    python -m tests.perf.bench_demo --base HEAD --until check --noop-repeat 1   # seconds

Each commit is cloned from this repository into --work and runs with this environment's Python
and DVC (the two commits must work with the same packages). The runs alternate, base first, so
both see the same machine. Outputs compared: every file under data/hidden and models/, and
reports/metrics.json key by key (keys that hold a time or a rate differ run to run and are listed
apart).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.perf.bench_extract import print_table

ROOT = Path(__file__).resolve().parents[2]
STAGE_MODULES = (
    "prep",
    "generate",
    "merge",
    "quality",
    "vocab",
    "extract",
    "train",
    "benchmark",
    "report",
)
COMPARED = ("data/hidden", "models")
TIMING_SUFFIXES = ("_per_s", "_s", "_seconds")  # metrics.json keys that hold a rate or a time


def clone(rev: str, where: Path) -> str:
    """A clean checkout of `rev` at `where`; returns the full commit id."""
    if where.exists():
        shutil.rmtree(where)
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(where)], check=True)
    subprocess.run(["git", "-C", str(where), "checkout", "-q", rev], check=True)
    out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True)
    return out.stdout.decode().strip()


def environment() -> dict[str, str]:
    """This interpreter's bin folder first on PATH, so `dvc` and `python` are this environment's."""
    bin_dir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def timed(command: list[str], cwd: Path, log: Path | None = None) -> float:
    """Wall seconds of `command` in `cwd`; its output to `log` (or discarded). Fails loudly."""
    start = time.perf_counter()
    with open(log or os.devnull, "ab") as out:
        done = subprocess.run(command, cwd=cwd, env=environment(), stdout=out, stderr=out)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed in {cwd} (exit {done.returncode}); see {log}")
    return seconds


def startup_seconds(tree: Path, module: str, repeat: int) -> float | None:
    """Median seconds of `python -m stages.<module> --help` in `tree` (None: no such stage)."""
    if not (tree / "stages" / f"{module}.py").exists():
        return None
    command = [sys.executable, "-m", f"stages.{module}", "--help"]
    return statistics.median(timed(command, tree) for _ in range(repeat))


def file_digests(tree: Path) -> dict[str, str]:
    """sha256 of every output file compared, by its path in the tree."""
    digests = {}
    for folder in COMPARED:
        for path in sorted((tree / folder).rglob("*")):
            if path.is_file():
                digests[str(path.relative_to(tree))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def metrics_differences(base: Path, head: Path) -> tuple[list[str], list[str]]:
    """Keys of reports/metrics.json whose values differ: (timing keys, all other keys)."""
    paths = [t / "reports" / "metrics.json" for t in (base, head)]
    if not all(p.exists() for p in paths):
        return [], []
    old, new = (json.loads(p.read_text()) for p in paths)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return [k for k in differ if k.endswith(TIMING_SUFFIXES)], [
        k for k in differ if not k.endswith(TIMING_SUFFIXES)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (e.g. fb2b1c5)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-demo"))
    parser.add_argument("--until", default=None, help="a stage: `dvc repro STAGE` (default: all)")
    parser.add_argument("--noop-repeat", type=int, default=3)
    parser.add_argument("--startup-repeat", type=int, default=3)
    parser.add_argument("--startup", nargs="*", default=list(STAGE_MODULES), help="stages to time")
    args = parser.parse_args(argv)

    head_rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True
    ).stdout.decode()
    trees = {"base": args.work / "base", "head": args.work / "head"}
    commits = {
        "base": clone(args.base, trees["base"]),
        "head": clone(head_rev.strip(), trees["head"]),
    }
    repro = ["dvc", "repro", *([args.until] if args.until else [])]
    rows = []
    full = {name: timed(repro, tree, args.work / f"{name}.log") for name, tree in trees.items()}
    noop: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.noop_repeat):
        for name, tree in trees.items():
            noop[name].append(timed(repro, tree, args.work / f"{name}.log"))
    rows.append(["dvc repro" + (f" {args.until}" if args.until else ""), *full.values()])
    rows.append(["no-op dvc repro (median)", *(statistics.median(v) for v in noop.values())])
    for module in args.startup:
        found = [startup_seconds(tree, module, args.startup_repeat) for tree in trees.values()]
        rows.append([f"start-up stages.{module}", *found])
    digests = {name: file_digests(tree) for name, tree in trees.items()}
    differ = sorted(
        p
        for p in digests["base"].keys() | digests["head"].keys()
        if digests["base"].get(p) != digests["head"].get(p)
    )
    timing, other = metrics_differences(trees["base"], trees["head"])
    print(f"output files compared: {len(digests['head'])}; differing: {differ or 'none'}")
    print(f"reports/metrics.json keys differing: {other or 'none'} (timings: {timing or 'none'})")
    print(f"base {commits['base'][:10]}  head {commits['head'][:10]}  (seconds, this machine)")
    print_table(
        ["what", "base s", "head s", "head/base"],
        [[what, _s(b), _s(h), f"{h / b:.2f}" if b and h else "-"] for what, b, h in rows],
    )
    return 1 if differ or other else 0


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f}"


if __name__ == "__main__":
    sys.exit(main())
