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
  prompt (4 a dataset): every reply must come back and the server must have speculated, accepting
  more than one token per verify step (meta_info `completion_tokens` / `spec_verify_ct`).
  `--extra-server-args` is appended where the SGLang installed lacks what the line needs (the
  device bundles leave out deep_gemm, which 0.5.17's draft worker needs for CUDA graphs).
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
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.perf.real_sglang import run_logged, run_paths
from tests.readme_text import readme_command

ROOT = Path(__file__).resolve().parents[2]
# the copy leaves out what no command reads: tools' folders and the outputs the commands rewrite
LEFT_OUT = {".git", ".venv", ".device", ".sglang-releases", ".dvc", "dvc_plots", "dvclive"}
LEFT_OUT_PATHS = {"data/hidden", "models/checkpoints"}
SERVER_URL = "http://127.0.0.1:30000"  # sglang.launch_server's default host and port
PROMPTS_PER_DATASET = 4
MAX_NEW_TOKENS = 128
TRAIN_STEPS = 40
# each command by how its README line starts
COMMANDS = {
    "serve": "python -m sglang.launch_server --model-path <target>",
    "canary": "torchrun --standalone --nproc-per-node 8 -m stages.commands.canary",
    "extract": "torchrun --standalone --nproc-per-node 8 -m stages.extract",
    "train": "torchrun --standalone --nproc-per-node 8 -m stages.train",
}


def as_run_here(command: str, target: str, gpus: int) -> list[str]:
    """The README's `command` with this machine's values: `<target>`, the GPUs per node, and the
    interpreter that runs this script for `python`."""
    words = [target if w == "<target>" else w for w in shlex.split(command)]
    if "--nproc-per-node" in words:
        words[words.index("--nproc-per-node") + 1] = str(gpus)
    if words[0] == "python":
        words[0] = sys.executable
    elif words[0] == "torchrun":
        words[:1] = [sys.executable, "-m", "torch.distributed.run"]  # the `torchrun` script's body
    return words


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

    def __init__(self, work: Path, extra_server_args: list[str]):
        import torch

        self.gpus = max(1, torch.cuda.device_count())
        self.work = work
        self.repo = workspace(work, self.gpus)
        self.extra_server_args = extra_server_args
        self.target = yaml.safe_load((self.repo / "params.yaml").read_text())["target"]["path"]

    def run(self, name: str, command: list[str], timeout_s: int = 900) -> str:
        print(f"[{name}] {shlex.join(command)}", flush=True)
        return run_logged(self.work / f"{name}.log", command, self.repo, timeout_s)

    def report(self, name: str) -> dict:
        return json.loads((self.repo / "reports" / f"{name}.json").read_text())


def serve(m: Machine) -> dict:
    from stages.serving.launch import start_server

    line = readme_command(COMMANDS["serve"])
    command = as_run_here(line, m.target, m.gpus) + m.extra_server_args
    print(f"[serve] {shlex.join(command)}", flush=True)
    log = m.work / "serve.log"
    server = start_server(command, SERVER_URL, health_timeout_s=900, log_path=log)
    try:
        replies = [generate(ids) for ids in demo_prompts(m.repo)]
    finally:
        server.stop()
    return served_figures(replies, m.report("benchmark"))


def demo_prompts(repo: Path) -> list[list[int]]:
    import pyarrow.parquet as pq

    prompts = []
    for path in sorted((repo / "data" / "prompts").glob("*.parquet")):
        column = pq.read_table(path, columns=["prompt_ids"])["prompt_ids"]
        prompts += column.to_pylist()[:PROMPTS_PER_DATASET]
    return prompts


def generate(ids: list[int]) -> dict:
    body = {
        "input_ids": ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS},
    }
    request = urllib.request.Request(
        f"{SERVER_URL}/generate",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as reply:
        return json.loads(reply.read())


def served_figures(replies: list[dict], benchmark: dict) -> dict:
    """Every reply has tokens and the server verified drafts, accepting more than one token per
    verify step on the whole; beside it the demo's in-process tau for reference."""
    tokens = sum(r["meta_info"]["completion_tokens"] for r in replies)
    verify = sum(r["meta_info"].get("spec_verify_ct", 0) for r in replies)
    answered = sum(bool(r.get("output_ids")) for r in replies)
    accept = round(tokens / verify, 4) if verify else None
    return {
        "passed": answered == len(replies) > 0 and accept is not None and accept > 1.0,
        "replies": len(replies),
        "answered": answered,
        "tokens": tokens,
        "verify_steps": verify,
        "accept_length": accept,
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
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    machine = Machine(args.work.resolve(), shlex.split(args.extra_server_args))
    paths = {name: (lambda _, f=PATHS[name]: f(machine)) for name in args.paths}
    return run_paths(paths, args.work, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
