"""Drafters trained with FP8 products (`train.fp8`, `dflash.fp8`) or eager (`compile: false`)
against drafters trained compiled in bf16, on acceptance: the real pretrained stories260K as the
target, its own greedy replies as the data, the same features, params and seeds for every arm,
each drafter measured by its train stage's evaluation (EAGLE-3: replayed and simulated tau;
DFlash: tau; bf16) and by its benchmark stage's greedy speculative decoding (tau at temperature 0,
the drafter as exported). The seeds' spread within each arm is the yardstick the difference
between the arms is read against.

    python -m tests.perf.bench_fp8_acceptance prepare --work DIR [--samples 400]
        [--new-tokens 160] [--epochs 8]
    python -m tests.perf.bench_fp8_acceptance compare --work DIR [--family eagle3|dflash]
        [--seeds 0 1 2] [--variants bf16 fp8 eager] [--json-out FILE] [--timeout-s 480]

`prepare` (any machine with dvc; needs ../shared): a copy of the project under DIR/project whose
params.yaml points at a copy of stories260K beside it (relative paths, so DIR travels), two prompt
sets (ShareGPT's first turns and FastChat's conversations, --samples each, the duplicates merged
away) and `dvc repro vocab`: the replies, the merged split and the draft vocabulary. Both families'
draft MLPs are 176 wide (the target's 172 is no multiple of 16, which FP8 products need), in every
arm.

`compare` (a GPU of compute capability 8.9+ for the fp8 arm; elsewhere its rows carry the stage's
refusal; the GPU machines lack dvc and duckdb, which it does not need): the real `extract` stage
once, where DIR/project/data/hidden is missing (it holds both families' layers); then per seed
and variant (bf16: the section as prepared, compiled as `compile: auto` runs on a GPU; fp8: its
`fp8` true; eager: its `compile` false) the family's real train stage (`train` or
`train_dflash`) and benchmark stage, each in a process of its own with a params file under
DIR/runs, all runs at once. One line per run, then per variant the mean and range over the seeds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.conftest import SHARED, STORIES
from tests.perf.bench_llama_stages import measured
from tests.perf.real_sglang import stage
from tests.project import copy_project, sh

# what each arm changes in the family's section
VARIANTS = {"bf16": {}, "fp8": {"fp8": True}, "eager": {"compile": False}}
TEMPLATE = "tests/fixtures/stories_chat_template.jinja"  # stories260K ships no chat template
PROMPT_SETS = {
    "sharegpt": "data/sharegpt/ShareGPT_V3_filtered_500.json",
    "conversations": "data/sharegpt/dummy_conversation.json",
}


@dataclass(frozen=True)
class Family:
    """A drafter family's params section, stages, the figures its reports give, and whether its
    train stage reads the draft vocabulary (EAGLE-3's drafts over a subset of the target's)."""

    section: str
    train: str
    benchmark: str
    figures: tuple[str, ...]  # train.json's best figures, then the benchmark's tau_greedy
    reads_vocab: bool


FAMILIES = {
    "eagle3": Family(
        "train", "train", "benchmark", ("best_replayed_tau", "best_simulated_tau"), True
    ),
    "dflash": Family("dflash", "train_dflash", "benchmark_dflash", ("best_tau",), False),
}


def stories_params(args) -> callable:
    def change(p: dict) -> None:
        p["target"].update(path="stories260K", chat_template=TEMPLATE)
        p["datasets"] = {
            name: {
                "prep": {
                    "format": "sharegpt",
                    "path": str(SHARED / rel),
                    "max_samples": args.samples,
                    "max_prompt_tokens": 64,
                },
                "generate": {"budget_tokens": 10**8},
                "expect": {"reasoning": False},  # a base model
            }
            for name, rel in PROMPT_SETS.items()
        }
        p["generate"].update(max_new_tokens=args.new_tokens, batch_size=32)
        p["merge"].update(eval_fraction=0.1)
        p["quality"].update(max_truncated=1.0)  # stories run past any limit
        p["vocab"]["draft_vocab_size"] = 256
        p["extract"]["layers"] = [1, 2, 3]  # 5 layers
        p["train"].update(
            epochs=args.epochs, batch_size=8, lr=3e-3, ttt_steps=7, eval_every=100,
            checkpoint_every=100, eval_max_samples=64, draft={"intermediate_size": 176},
        )  # fmt: skip
        p["dflash"]["draft"] = {"intermediate_size": 176}
        p["benchmark"].update(max_prompts=64, max_new_tokens=96, temperatures=[0.0])

    return change


def prepare(args) -> None:
    project = args.work / "project"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    shutil.copytree(STORIES, project / "stories260K")
    copy_project(project, stories_params(args))
    sh(["dvc", "repro", "vocab"], project)
    merge = json.loads((project / "reports" / "merge.json").read_text())
    print(f"prepared {project}: {json.dumps(merge)[:300]}")


def run_params(project: Path, run: Path, device: str, section: str = "train", **train) -> Path:
    """The project's params with absolute paths (the stages run from the repository root), on
    `device`, with `train` set in `section`."""
    p = yaml.safe_load((project / "params.yaml").read_text())
    p["target"].update(
        path=str(project / p["target"]["path"]),
        chat_template=str(project / p["target"]["chat_template"]),
        device=device,
    )
    p[section].update(train, device=device)
    path = run / "params.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return path


def run_stage(module: str, stage_args: list, run: Path, timeout_s: int) -> None:
    """stages.<module> from the repository root, its log run/<module>.log."""
    stage(run, module, f"stages.{module}", *map(str, stage_args), timeout_s=timeout_s)


def extract(args, device: str) -> dict:
    """The features of the prepared replies, once (the same for every run)."""
    data = args.work / "project" / "data"
    report = args.work / "extract.json"
    if not (data / "hidden").exists():
        p = run_params(args.work / "project", args.work, device)
        io = ["--merged", data / "merged", "--out", data / "hidden", "--report", report]
        run_stage("extract", [*io, "--params", p], args.work, args.timeout_s)
    return json.loads(report.read_text()) if report.exists() else {}


def train_and_benchmark(args, name: str, changes: dict, seed: int, device: str) -> dict:
    family = FAMILIES[args.family]
    project, run = args.work / "project", args.work / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    p = str(run_params(project, run, device, family.section, **changes, seed=seed))
    data = project / "data"
    train = ["--hidden-dir", data / "hidden"]
    if family.reads_vocab:
        train += ["--vocab-file", data / "vocab/d2t_t2d.safetensors"]
    train += ["--checkpoint-dir", run / "checkpoints", "--out-dir", run / "drafter"]
    train += ["--report", run / "train.json", "--plots", run / "plots", "--params", p]
    bench = ["--merged", data / "merged", "--drafter-dir", run / "drafter"]
    bench += ["--report", run / "benchmark.json", "--plot", run / "benchmark.csv", "--params", p]
    run_stage(family.train, train, run, args.timeout_s)
    run_stage(family.benchmark, bench, run, args.timeout_s)
    t = json.loads((run / "train.json").read_text())
    b = json.loads((run / "benchmark.json").read_text())
    kept = ("steps", "final_loss", *family.figures, "compiled", "tokens_per_s")
    return {**{k: t[k] for k in kept}, "tau_greedy": b["tau_greedy"]}


# what the train stage stops with at a step whose loss is not finite (training.py refuse_diverged)
DIVERGED = "training diverged"


def summary(rows: dict[str, dict], family: Family) -> dict[str, dict]:
    """Per variant and figure: mean, min, max over the seeds that finished; and how many runs
    diverged (the train stage stopped at a loss that was not finite)."""
    out = {}
    for variant in (v for v in VARIANTS if any(name.startswith(v) for name in rows)):
        mine = [r for name, r in rows.items() if name.startswith(variant)]
        done = [r for r in mine if "error" not in r]
        out[variant] = {
            f: {
                "mean": round(statistics.fmean(r[f] for r in done), 4),
                "min": min(r[f] for r in done),
                "max": max(r[f] for r in done),
            }
            for f in (*family.figures, "tau_greedy")
            if done
        } | {"runs": len(done), "diverged": sum(DIVERGED in r.get("error", "") for r in mine)}
    return out


def compare(args) -> dict:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    features = extract(args, device)
    print("features", json.dumps({k: features.get(k) for k in ("tokens", "samples", "engine")}))
    runs = {f"{v}-s{seed}": (VARIANTS[v], seed) for seed in args.seeds for v in args.variants}
    with ThreadPoolExecutor(len(runs)) as pool:
        futures = {
            name: pool.submit(measured, lambda n=name, c=changes, s=seed: train_and_benchmark(
                args, n, c, s, device))
            for name, (changes, seed) in runs.items()
        }  # fmt: skip
        rows = {name: future.result() for name, future in futures.items()}
    for name, row in rows.items():
        print(name, json.dumps(row))
    result = {
        "device": device,
        "family": args.family,
        "features": features,
        "runs": rows,
        "summary": summary(rows, FAMILIES[args.family]),
    }
    for variant, figures in result["summary"].items():
        print(variant, json.dumps(figures))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["prepare", "compare"])
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-fp8-acceptance"))
    parser.add_argument("--samples", type=int, default=400, help="prompts per set")
    parser.add_argument("--new-tokens", type=int, default=160, help="generate.max_new_tokens")
    parser.add_argument("--epochs", type=float, default=8, help="train.epochs")
    parser.add_argument("--family", choices=list(FAMILIES), default="eagle3")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["bf16", "fp8"])
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--timeout-s", type=int, default=480, help="per stage run")
    args = parser.parse_args(argv)
    args.work = args.work.resolve()
    if args.command == "prepare":
        return prepare(args)
    return compare(args)


if __name__ == "__main__":
    main()
