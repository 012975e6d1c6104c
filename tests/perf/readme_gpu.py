"""The README's GPU commands as written, on a GPU with SGLang installed, over a finished demo run:
one line of figures per command, exit 1 when one fails.

    python -m tests.perf.readme_gpu [--work DIR] [--paths ...] [--json-out FILE]
        [--extra-server-args "--disable-cuda-graph"]

Run from the repository root of a finished demo run (data/prompts, data/merged, data/vocab,
models/drafter, reports), with SGLang importable (on the device: one bundle of
../shared/sglang-h200, README there). The commands are read from README.md, never restated here;
what changes is only what a user changes for their machine, printed beside each command:

- `<target>` is params' `target.path` (the demo target) and `--nproc-per-node 8` the GPUs here;
- params.yaml is pointed at the GPUs as the README's Kimi-K2.5 block points it at a node:
  `target.device cuda`, `extract.engine sglang` at `tp_size` = the GPUs, and a short training
  (`train.max_steps` 40). The commands run in a copy of the repository under --work (their default
  paths, params.yaml, data/hidden and reports/, are the copy's).

The commands:

- serve: "Serving the drafter"'s SGLang line (its default port), then one greedy /generate per
  prompt (4 a dataset) through the served benchmark's client: every reply must come back and the
  server must have speculated, accepting more than one token per verify step (its tau).
  `--extra-server-args` is appended where the SGLang installed lacks what the line needs (the
  device bundles leave out deep_gemm, which 0.5.17's draft worker needs for CUDA graphs);
  `--server-module tests.doubles.hf_server` serves it with the CPU stand-in instead.
- canary: step 7's `torchrun ... -m stages.commands.canary`, with `extract.canary.reference hf` and
  without `--load-reference`: the http reference it loads is served only by SGLang 0.5.23
  (`--enable-return-aux-hidden-states`), so the reference is the hf model on the GPU.
- extract: step 7's `torchrun ... -m stages.extract` with the sglang engine: every shard written.
- train: step 8's `torchrun ... -m stages.train` with the options dvc.yaml passes (`--live` left out
  where dvclive cannot be imported: it needs dvc, which the device lacks): its steps, compiled on
  the GPU, the drafter exported in the target's dtype.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from stages.engines import Sampling
from stages.engines.sglang_http import SGLangEngine
from stages.serving.bench import ServerRun, acceptance, measure
from stages.serving.launch import server_url, start_server
from tests.perf.real_sglang import run_logged, run_paths
from tests.readme_text import as_run_here, readme_command

ROOT = Path(__file__).resolve().parents[2]
# the copy leaves out what no command reads: tools' folders and the outputs the commands rewrite
LEFT_OUT = {".git", ".venv", ".device", ".sglang-releases", ".dvc", "dvc_plots", "dvclive"}
LEFT_OUT_PATHS = {"data/hidden", "models/checkpoints"}
DEFAULT_PORT = 30000  # sglang.launch_server's, on 127.0.0.1
PROMPTS_PER_DATASET = 4
MAX_NEW_TOKENS = 128
TRAIN_STEPS = 40
# each command by how its README line starts
COMMANDS = {
    "serve": "python -m sglang.launch_server --model-path <target> --speculative-algorithm EAGLE3",
    "canary": "torchrun --standalone --nproc-per-node 8 -m stages.commands.canary",
    "extract": "torchrun --standalone --nproc-per-node 8 -m stages.extract",
    "train": "torchrun --standalone --nproc-per-node 8 -m stages.train",
}


def gpu_params(p: dict, gpus: int) -> dict:
    """params.yaml pointed at the GPUs here, as the README's Kimi-K2.5 block points it at a node."""
    p["target"].update(device="cuda")
    p["extract"]["engine"] = "sglang"
    p["extract"]["sglang"].update(tp_size=gpus, mem_fraction_static=0.5)
    p["extract"]["canary"].update(reference="hf", hf_device="cuda")
    p["train"].update(
        max_steps=TRAIN_STEPS, eval_every=TRAIN_STEPS // 2, checkpoint_every=TRAIN_STEPS // 2
    )
    p["train"]["device"] = "cuda"
    return p


def workspace(work: Path, gpus: int) -> Path:
    """A copy of the repository with params.yaml pointed at the GPUs (made once per --work)."""
    copy = work / "repo"
    if copy.exists():
        return copy

    def left_out(folder: str, names: list[str]) -> list[str]:
        here = Path(folder).relative_to(ROOT)
        return [
            n
            for n in names
            if n in LEFT_OUT or n == "__pycache__" or (here / n).as_posix() in LEFT_OUT_PATHS
        ]

    shutil.copytree(ROOT, work / "repo.tmp", ignore=left_out, dirs_exist_ok=True)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    text = yaml.safe_dump(gpu_params(params, gpus), sort_keys=False)
    (work / "repo.tmp" / "params.yaml").write_text(text)
    (work / "repo.tmp").rename(copy)
    return copy


class Machine:
    """The GPUs here, the work folder and the repository copy the commands run in."""

    def __init__(self, work: Path, extra_server_args: list[str], server_module: str):
        import torch

        self.gpus = max(1, torch.cuda.device_count())
        self.work = work
        self.repo = workspace(work, self.gpus)
        self.extra_server_args, self.server_module = extra_server_args, server_module
        self.target = yaml.safe_load((self.repo / "params.yaml").read_text())["target"]["path"]

    def run(self, name: str, command: list[str], timeout_s: int = 900) -> str:
        print(f"[{name}] {shlex.join(command)}", flush=True)
        return run_logged(self.work / f"{name}.log", command, self.repo, timeout_s)

    def report(self, name: str) -> dict:
        return json.loads((self.repo / "reports" / f"{name}.json").read_text())


def serve(m: Machine) -> dict:
    """The README's line served; the requests and the acceptance arithmetic are the served
    benchmark's own (stages/serving/bench.py), so a reply that aborts or a server that does not
    speculate fails here as it fails there."""
    line = readme_command(COMMANDS["serve"])
    command = as_run_here(line, m.target, m.gpus) + m.extra_server_args
    command[command.index("-m") + 1] = m.server_module
    port = int(command[command.index("--port") + 1]) if "--port" in command else DEFAULT_PORT
    url = server_url("127.0.0.1", port)
    server = start_server(command, url, health_timeout_s=900, log_path=m.work / "serve.log")
    try:
        engine = SGLangEngine([url], concurrency=4, timeout_s=300)
        run = measure(engine, demo_prompts(m.repo), Sampling(max_new_tokens=MAX_NEW_TOKENS))
    finally:
        server.stop()
    return served_figures(run, m.report("benchmark"))


def demo_prompts(repo: Path) -> list[tuple[str, list[int]]]:
    """The first PROMPTS_PER_DATASET prompts of each dataset, as (sample id, prompt ids)."""
    import pyarrow.parquet as pq

    requests = []
    for path in sorted((repo / "data" / "prompts").glob("*.parquet")):
        table = pq.read_table(path, columns=["sample_id", "prompt_ids"])
        rows = table.slice(0, PROMPTS_PER_DATASET).to_pylist()
        requests += [(row["sample_id"], row["prompt_ids"]) for row in rows]
    return requests


def served_figures(run: ServerRun, benchmark: dict) -> dict:
    """Every reply has tokens and the server accepted more than one token per verify step on the
    whole (a server that does not speculate is refused by `acceptance`); beside it the demo's
    in-process tau for reference."""
    accepted = acceptance(run)
    answered = sum(bool(r.completion.output_ids) for r in run.replies)
    return {
        "passed": answered == accepted.requests > 0 and accepted.tau > 1.0,
        "replies": accepted.requests,
        "answered": answered,
        "tokens": accepted.completion_tokens,
        "verify_steps": accepted.verify_steps,
        "accept_length": round(accepted.tau, 4),
        "without_prefill": round(accepted.tau_excluding_prefill, 4),
        "demo_tau_in_process": benchmark.get("tau_greedy"),
    }


def canary(m: Machine) -> dict:
    line = readme_command(COMMANDS["canary"])
    words = as_run_here(line, m.target, m.gpus)
    at = words.index("--load-reference")
    out = m.run("canary", words[:at] + words[at + 2 :])
    table = [line.removeprefix("[canary] ") for line in out.splitlines() if "[canary]" in line]
    return {"passed": True, "table": table}


def extract(m: Machine) -> dict:
    line = readme_command(COMMANDS["extract"])
    m.run("extract", as_run_here(line, m.target, m.gpus))
    report = m.report("extract")
    shards = sorted((m.repo / "data" / "hidden").glob("**/*.safetensors"))
    return {
        "passed": report["engine"] == "sglang" and len(shards) == report["shards"] > 0,
        "engine": report["engine"],
        "shards": report["shards"],
        "world_size": report["world_size"],
        "tokens_per_s": report["tokens_per_s"],
    }


def train(m: Machine) -> dict:
    line = readme_command(COMMANDS["train"])
    cmd = yaml.safe_load((m.repo / "dvc.yaml").read_text())["stages"]["train"]["cmd"]
    options = shlex.split(cmd)
    options = options[options.index("stages.train") + 1 :]
    if not _dvclive_imports():
        at = options.index("--live")
        print(f"[train] {shlex.join(options[at : at + 2])} left out: dvclive needs dvc", flush=True)
        options = options[:at] + options[at + 2 :]
    m.run("train", as_run_here(line, m.target, m.gpus) + options)
    report = m.report("train")
    dtype = json.loads((m.repo / "models" / "drafter" / "config.json").read_text()).get("dtype")
    return {
        "passed": report["steps"] == TRAIN_STEPS and report["compiled"] and dtype == "bfloat16",
        "steps": report["steps"],
        "compiled": report["compiled"],
        "final_loss": report["final_loss"],
        "tokens_per_s": report["tokens_per_s"],
        "drafter_dtype": dtype,
    }


def _dvclive_imports() -> bool:
    """Whether dvclive's Live imports (a demo run's `dvclive/` folder imports as an empty
    namespace package where no dvclive is installed)."""
    try:
        from dvclive import Live  # noqa: F401
    except ImportError:
        return False
    return True


PATHS: dict[str, Callable[[Machine], dict]] = {
    "serve": serve,
    "canary": canary,
    "extract": extract,
    "train": train,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/readme-gpu"))
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--extra-server-args", default="", help="appended to the serve line")
    parser.add_argument(
        "--server-module",
        default="sglang.launch_server",
        help="the serve line's module (tests.doubles.hf_server: the CPU stand-in)",
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    extra = shlex.split(args.extra_server_args)
    machine = Machine(args.work.resolve(), extra, args.server_module)
    paths = {name: (lambda _, f=PATHS[name]: f(machine)) for name in args.paths}
    return run_paths(paths, args.work, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
