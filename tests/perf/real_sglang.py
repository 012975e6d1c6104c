"""Every SGLang-facing path of the pipeline, run against the SGLang release installed here, through
the project's own commands, on a GPU: one line of figures per path, exit 1 when any path fails.

    python -m tests.perf.real_sglang [--work DIR] [--paths ...] [--json-out FILE]

Run from the repository root of a finished demo run (data/prompts, data/merged, data/vocab,
models/drafter, models/card, reports), with SGLang importable (on the device: one bundle of
../shared/sglang-h200, README there). The paths, each stage in a process of its own with a params
file written under --work from params.yaml:

- canary-llama: `stages.commands.canary`, extract.engine sglang (tp 1) against the hf reference on
  the GPU, on the demo target (Llama).
- canary-deepseek: the same on a random DeepSeek-V3 with Kimi-K2.5's head dims, MoE keys and yarn
  RoPE (tests/mla_target.py `kimi-heads`).
- canary-k25: the same weights in Kimi-K2.5's own layout (`KimiK25ForConditionalGeneration`, a
  multimodal wrapper with a one-layer MoonViT: tests/mla_target.py `k25_layout`) through the
  sglang engine, against the hf reference of the plain DeepSeek-V3 (`--reference-path`: the
  wrapper is remote code transformers cannot load).
- extract-k25: `stages.extract` with the sglang engine on the Kimi-K2.5 layout and on the plain
  DeepSeek-V3 of the same weights: ids equal, the features' largest difference per shard.
- dflash-served: the demo's DFlash drafter as the train_dflash stage exported it (models/dflash,
  unedited) served by SGLang's DFLASH worker (triton attention, no CUDA graphs) beside a plain
  server, both with --enable-deterministic-inference (both without it, said in the figures, when
  the DFLASH server does not start with it): greedy replies compared, the served accept length
  from `meta_info`.
- generate: `stages.generate` of one dataset through a server it launches from params, and with
  the hf engine on the GPU: the rows whose output_ids are identical.
- extract: `stages.extract` with the sglang engine and with the hf engine: ids and loss masks
  equal, the features' largest relative difference per shard.
- benchmark, benchmark-dflash: `stages.benchmark` (EAGLE-3, models/drafter) and
  `stages.benchmark_dflash` (DFlash, models/dflash) served (both servers launched from params, the
  drafter as its train stage exported it) and in-process on the GPU: tau at T=0 of each (without
  the prefill token), their verify steps.
- online: `stages.extract` with store none, then `stages.train` over the sglang engine: its steps
  and `features`.
- launch-line: the launch line the model card and report print, against the speculative server's
  command the benchmark ran.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PORT = 30100
DATASET = "sharegpt"
SERVER = dict(host="127.0.0.1", port=PORT, mem_fraction_static=0.5)


def params(work: Path, name: str, change: Callable[[dict], None]) -> Path:
    """params.yaml with `change` applied, written as work/<name>.yaml."""
    p = yaml.safe_load((ROOT / "params.yaml").read_text())
    p["target"].update(device="cuda", dtype="bfloat16")
    p["extract"]["sglang"].update(tp_size=1, mem_fraction_static=0.5)
    change(p)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(p, sort_keys=False))
    return path


def stage(work: Path, name: str, module: str, *args: str, timeout_s: int = 900) -> str:
    """`python -m module args`, its output to work/<name>.log; raises with its tail on failure."""
    return run_logged(work / f"{name}.log", [sys.executable, "-m", module, *args], ROOT, timeout_s)


ERROR_LINE = re.compile(r"^(\[rank\d+\]: )?(error: |[\w.]*(Error|Exception)\b)")


def run_logged(log: Path, command: list[str], cwd: Path, timeout_s: int = 900) -> str:
    """`command` run in `cwd`, its output to `log`; raises with its tail on failure."""
    with log.open("w") as out:
        done = subprocess.run(
            command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    text = log.read_text()
    if done.returncode:
        lines = text.splitlines()
        # under torchrun the launcher's own traceback comes last: the ranks' errors go first
        errors = [line for line in lines if ERROR_LINE.match(line)]
        tail = "\n".join(errors[-5:] + ["..."] + lines[-15:])
        raise RuntimeError(f"{shlex.join(command[1:])} exited {done.returncode}:\n{tail}")
    return text


def canary_params(p: dict) -> None:
    p["extract"]["engine"] = "sglang"
    p["extract"]["canary"].update(reference="hf", hf_device="cuda")


def generate_params(engine: str) -> Callable[[dict], None]:
    def change(p: dict) -> None:
        p["generate"]["engine"] = engine
        p["generate"]["sglang"]["urls"] = [f"http://127.0.0.1:{PORT}"]
        p["generate"]["sglang"]["launch"] = {"server_args": dict(SERVER)}

    return change


def extract_params(engine: str, store: str) -> Callable[[dict], None]:
    def change(p: dict) -> None:
        p["extract"].update(engine=engine, store=store)

    return change


def benchmark_params(mode: str) -> Callable[[dict], None]:
    def change(p: dict) -> None:
        p["benchmark"].update(mode=mode, temperatures=[0.0], max_prompts=4)
        # CUDA graphs off: the device bundles leave out deep_gemm, which 0.5.17's draft worker
        # imports to capture them (../shared/sglang-h200/README.md)
        p["benchmark"]["sglang"]["launch"] = {
            "server_args": dict(SERVER, port=PORT + 1),
            "extra_args": ["--disable-cuda-graph"],
        }

    return change


def online_params(p: dict) -> None:
    p["extract"].update(engine="sglang", store="none")
    p["train"].update(max_steps=40, eval_every=20, checkpoint_every=20, device="cuda")


# every params file the paths write, by name (tests/perf/test_real_sglang.py checks each one)
VARIANTS: dict[str, Callable[[dict], None]] = {
    "canary": canary_params,
    "generate-sglang": generate_params("sglang"),
    "generate-hf": generate_params("hf"),
    "extract-sglang-all": extract_params("sglang", "all"),
    "extract-hf-all": extract_params("hf", "all"),
    "extract-sglang-none": extract_params("sglang", "none"),
    "benchmark-sglang": benchmark_params("sglang"),
    "benchmark-hf": benchmark_params("hf"),
    "train-online": online_params,
}


def canary(work: Path, name: str, target: str | None = None, *options: str) -> dict:
    def change(p: dict) -> None:
        canary_params(p)
        if target:
            p["target"]["path"] = target

    p = params(work, name, change)
    out = stage(
        work,
        name,
        "stages.commands.canary",
        "--merged",
        "data/merged",
        "--samples",
        "8",
        "--params",
        str(p),
        *options,
    )
    lines = [line.removeprefix("[canary] ") for line in out.splitlines() if "[canary]" in line]
    return {"passed": True, "table": lines}


def deepseek_target(work: Path) -> Path:
    """The kimi-heads DeepSeek-V3, built once under `work`."""
    from tests.mla_target import kimi_heads_target

    target = work / "deepseek-v3-kimi-heads"
    if not (target / "config.json").exists():
        kimi_heads_target(target)
    return target


def k25_target(work: Path) -> Path:
    """The same weights in Kimi-K2.5's layout, built once under `work`."""
    from tests.mla_target import k25_layout

    target = work / "kimi-k25-layout"
    if not (target / "config.json").exists():
        k25_layout(deepseek_target(work), target)
    return target


def canary_deepseek(work: Path) -> dict:
    return canary(work, "canary-deepseek", str(deepseek_target(work)))


def canary_k25(work: Path) -> dict:
    plain = str(deepseek_target(work))
    return canary(work, "canary-k25", str(k25_target(work)), "--reference-path", plain)


def first_prompts(merged: Path, k: int) -> list[tuple[str, list[int]]]:
    """(sample id, prompt ids) of the first k merged samples: each sample's ids up to its first
    supervised token."""
    import pyarrow.parquet as pq

    rows = pq.read_table(merged / "train.parquet").slice(0, k).to_pylist()
    return [(r["sample_id"], r["input_ids"][: r["loss_spans"][0][0]]) for r in rows]


def served_greedy(
    work: Path, name: str, extra: list[str], prompts: list, deterministic: bool = True
) -> dict:
    """Launch the demo target with `extra` flags, send `prompts` greedily, stop it: each
    sample's output ids, and the replies' completion tokens and verify steps."""
    from stages.engines import Sampling
    from stages.engines.sglang_http import SGLangEngine
    from stages.serving.bench import measure
    from stages.serving.launch import SGLangServer, launch_command, server_url

    port = PORT + 2
    args = dict(port=port, mem_fraction_static=0.5)
    if deterministic:
        args["enable_deterministic_inference"] = True
    command = launch_command(str(ROOT / "data/demo/target"), args, extra)
    url = server_url("127.0.0.1", port)
    with SGLangServer(command, url, work / f"server-{name}.log") as server:
        healthy_s = server.wait_healthy(600)
        run = measure(SGLangEngine([url], concurrency=16), prompts, Sampling(max_new_tokens=128))
    return {
        "outputs": run.outputs,
        "tokens": run.completion_tokens,
        "verify": sum(int(r.meta_info.get("spec_verify_ct", 0)) for r in run.replies),
        "healthy_s": round(healthy_s),
        "command": shlex.join(command[1:]),
    }


def dflash_served(work: Path) -> dict:
    from stages.serving.launch import ServerError

    drafter = ROOT / "models/dflash"
    prompts = first_prompts(ROOT / "data/merged", 32)
    flags = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter)]
    try:
        dflash = served_greedy(work, "dflash", [*flags, "--disable-cuda-graph"], prompts)
        deterministic = True
    except ServerError as err:  # the DFLASH worker refuses deterministic inference
        print(f"dflash-served: deterministic server did not start ({err}); again without")
        deterministic = False
        dflash = served_greedy(work, "dflash", [*flags, "--disable-cuda-graph"], prompts, False)
    plain = served_greedy(work, "plain", ["--disable-cuda-graph"], prompts, deterministic)
    same = sum(dflash["outputs"][k] == v for k, v in plain["outputs"].items())
    return {
        "passed": same == len(prompts) and dflash["verify"] > 0,
        "deterministic": deterministic,
        "identical": f"{same} of {len(prompts)}",
        "tokens": dflash["tokens"],
        "accept_length": round(dflash["tokens"] / max(dflash["verify"], 1), 4),
        "healthy_s": [plain["healthy_s"], dflash["healthy_s"]],
        "command": dflash["command"],
    }


def raw_ids(raw_dir: Path) -> dict[str, list[int]]:
    import pyarrow.dataset as ds

    parts = [str(p) for p in sorted(raw_dir.glob("*.parquet"))]  # not their checksum files
    table = ds.dataset(parts, format="parquet").to_table(columns=["sample_id", "output_ids"])
    return dict(zip(table["sample_id"].to_pylist(), table["output_ids"].to_pylist()))


def generate(work: Path) -> dict:
    runs = {}
    for engine in ("sglang", "hf"):
        p = params(work, f"generate-{engine}", VARIANTS[f"generate-{engine}"])
        start = time.monotonic()
        stage(
            work,
            f"generate-{engine}",
            "stages.generate",
            DATASET,
            "--prompts",
            f"data/prompts/{DATASET}.parquet",
            "--out",
            str(work / f"raw-{engine}"),
            "--report",
            str(work / f"generate-{engine}.json"),
            "--params",
            str(p),
        )
        runs[engine] = (raw_ids(work / f"raw-{engine}"), time.monotonic() - start)
    served, hf = runs["sglang"][0], runs["hf"][0]
    same = sum(served[k] == hf.get(k) for k in served)
    tokens = sum(len(v) for v in served.values())
    return {
        "passed": same == len(hf) == len(served),
        "rows": len(served),
        "identical": same,
        "tokens": tokens,
        "sglang_s": round(runs["sglang"][1], 1),
        "hf_s": round(runs["hf"][1], 1),
    }


def extract_with(
    work: Path, engine: str, store: str = "all", target: Path | None = None, tag: str = ""
) -> Path:
    """`stages.extract` with `engine` (on `target`, else params'); its shards' folder."""
    name = f"extract-{engine}-{store}"

    def change(p: dict) -> None:
        VARIANTS[name](p)
        if target is not None:
            p["target"]["path"] = str(target)

    p = params(work, f"{name}{tag}", change)
    out = work / f"hidden-{engine}-{store}{tag}"
    stage(
        work,
        f"{name}{tag}",
        "stages.extract",
        "--merged",
        "data/merged",
        "--out",
        str(out),
        "--report",
        str(work / f"{name}{tag}.json"),
        "--params",
        str(p),
    )
    return out


def shard_differences(first: Path, second: Path) -> dict:
    """The largest relative difference of aux and last over the shards of two extractions of
    the same samples (ids and loss masks must be equal), and how many shards."""
    import torch
    from safetensors.torch import load_file

    from stages.artifacts.hidden import shard_files

    pairs = list(zip(shard_files(first), shard_files(second), strict=True))
    worst = {"aux": 0.0, "last": 0.0}
    for a, b in pairs:
        x, y = load_file(str(a)), load_file(str(b))
        for key in ("input_ids", "loss_mask"):
            if not torch.equal(x[key], y[key]):
                raise ValueError(f"{a.name}: {key} differ")
        for key in worst:
            if key in x:
                diff = (x[key].float() - y[key].float()).norm() / y[key].float().norm()
                worst[key] = max(worst[key], float(diff))
    return {"shards": len(pairs), **worst}


def extract(work: Path) -> dict:
    diff = shard_differences(extract_with(work, "sglang"), extract_with(work, "hf"))
    reports = {
        e: json.loads((work / f"extract-{e}-all.json").read_text()) for e in ("sglang", "hf")
    }
    return {
        "passed": diff["aux"] < 0.05 and diff["last"] < 0.05,
        "shards": diff["shards"],
        "aux_rel": f"{diff['aux']:.1e}",
        "last_rel": f"{diff['last']:.1e}",
        "sglang_tok_s": reports["sglang"].get("tokens_per_s"),
        "hf_tok_s": reports["hf"].get("tokens_per_s"),
    }


def extract_k25(work: Path) -> dict:
    """The sglang engine on Kimi-K2.5's layout and on the plain DeepSeek-V3 of the same weights:
    the same SGLang language model class under the wrapper, so the same features."""
    wrapped = extract_with(work, "sglang", target=k25_target(work), tag="-k25")
    plain = extract_with(work, "sglang", target=deepseek_target(work), tag="-deepseek")
    diff = shard_differences(wrapped, plain)
    report = json.loads((work / "extract-sglang-all-k25.json").read_text())
    return {
        "passed": diff["aux"] < 1e-3 and diff["last"] < 1e-3,
        "shards": diff["shards"],
        "aux_rel": f"{diff['aux']:.1e}",
        "last_rel": f"{diff['last']:.1e}",
        "k25_tok_s": report.get("tokens_per_s"),
    }


def benchmark_family(stage_module: str, drafter_dir: str, tag: str) -> Callable[[Path], dict]:
    """A benchmark stage served and in process: the same prompts, tau at T=0 of each."""

    def path(work: Path) -> dict:
        results = {}
        for mode in ("sglang", "hf"):
            name = f"benchmark{tag}-{mode}"
            p = params(work, name, VARIANTS[f"benchmark-{mode}"])
            stage(
                work,
                name,
                stage_module,
                "--merged",
                "data/merged",
                "--drafter-dir",
                drafter_dir,
                "--report",
                str(work / f"{name}.json"),
                "--plot",
                str(work / f"{name}.csv"),
                "--params",
                str(p),
            )
            results[mode] = json.loads((work / f"{name}.json").read_text())
        served, in_process = greedy_tau(results["sglang"]), greedy_tau(results["hf"])
        close = abs(served - in_process) <= 0.05 * in_process
        return {
            "passed": close and served > 1.0,
            "served_tau": served,
            "in_process_tau": in_process,
            "served_verify_steps": results["sglang"]["temperatures"]["0.0"].get("verify_steps"),
            "version": results["sglang"].get("engine_version"),
        }

    return path


def greedy_tau(report: dict) -> float:
    """tau at T=0 without the prefill token: the in-process benchmark's own tau, the served
    one's tau_excluding_prefill."""
    greedy = report["temperatures"]["0.0"]
    return round(float(greedy.get("tau_excluding_prefill", report["tau_greedy"])), 4)


def online(work: Path) -> dict:
    hidden = extract_with(work, "sglang", store="none")
    p = params(work, "train-online", VARIANTS["train-online"])
    stage(
        work,
        "train-online",
        "stages.train",
        "--hidden-dir",
        str(hidden),
        "--vocab-file",
        "data/vocab/d2t_t2d.safetensors",
        "--checkpoint-dir",
        str(work / "ckpt-online"),
        "--out-dir",
        str(work / "drafter-online"),
        "--report",
        str(work / "train-online.json"),
        "--plots",
        str(work / "plots-online"),
        "--params",
        str(p),
    )
    report = json.loads((work / "train-online.json").read_text())
    drafter = json.loads((work / "drafter-online" / "config.json").read_text())
    return {
        "passed": report.get("features") == "online sglang" and report.get("steps") == 40,
        "steps": report.get("steps"),
        "features": report.get("features"),
        "final_loss": report.get("final_loss"),
        "drafter_dtype": drafter.get("dtype"),
    }


def launch_line_path(work: Path) -> dict:
    """The card's launch line: every flag it names is in the command that served, same value."""
    served = json.loads((work / "benchmark-sglang.json").read_text())
    ran = next(s["command"] for s in served["servers"].values() if "--speculative" in s["command"])
    card = (ROOT / "models" / "card" / "README.md").read_text()
    wanted, differ = launch_line_differences(card, ran)
    return {"passed": not differ, "flags": wanted, "differ": differ or None}


def launch_line_differences(card: str, ran: str) -> tuple[int, dict]:
    """(how many flags the card's launch line names, those the command that ran gives otherwise:
    flag -> (the card's value, the command's))."""
    line = next(line.strip() for line in card.splitlines() if "--speculative-algorithm" in line)
    wanted, got = flags(shlex.split(line)), flags(shlex.split(ran))
    return len(wanted), {k: (v, got.get(k)) for k, v in wanted.items() if got.get(k) != v}


def flags(command: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for i, word in enumerate(command):
        if word.startswith("--"):
            value = command[i + 1] if i + 1 < len(command) else None
            out[word] = None if value is None or value.startswith("--") else value
    return out


PATHS: dict[str, Callable[[Path], dict]] = {
    "canary-llama": lambda work: canary(work, "canary-llama"),
    "canary-deepseek": canary_deepseek,
    "canary-k25": canary_k25,
    "extract-k25": extract_k25,
    "dflash-served": dflash_served,
    "generate": generate,
    "extract": extract,
    "benchmark": benchmark_family("stages.benchmark", "models/drafter", ""),
    "benchmark-dflash": benchmark_family("stages.benchmark_dflash", "models/dflash", "-dflash"),
    "launch-line": launch_line_path,
    "online": online,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/real-sglang"))
    parser.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    return run_paths({name: PATHS[name] for name in args.paths}, args.work, args.json_out)


def run_paths(paths: dict[str, Callable[[Path], dict]], work: Path, json_out: Path | None) -> int:
    """Each path in turn, one line of figures each (a path that fails is reported, the others
    still run), the results written to `json_out` after each; 1 when any failed."""
    work.mkdir(parents=True, exist_ok=True)
    from stages.capture.releases import installed_sglang_version

    version = installed_sglang_version()
    print(f"SGLang {version}, work in {work}", flush=True)
    results = {}
    for name, path in paths.items():
        start = time.monotonic()
        try:
            result = path(work)
        except Exception as err:
            result = {"passed": False, "error": f"{type(err).__name__}: {err}"}
        result["seconds"] = round(time.monotonic() - start, 1)
        results[name] = result
        shown = {k: v for k, v in result.items() if k not in ("passed", "table")}
        print(
            f"{name:16} {'PASS' if result['passed'] else 'FAIL'}  {json.dumps(shown)}", flush=True
        )
        for line in result.get("table", []):
            print(f"{'':18}{line}")
        if json_out:
            json_out.write_text(json.dumps({"sglang": version, "paths": results}, indent=2))
    return 0 if all(r["passed"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
