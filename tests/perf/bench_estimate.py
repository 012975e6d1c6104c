"""`eagle-pipeline estimate` against the run it projects, on one server: the estimate over a
folder of prompts files, then the generate stage over each dataset in turn, projected seconds
against measured.

    python -m tests.perf.bench_estimate --prep ../shared/data --prompts DIR   # on any machine
    python -m tests.perf.bench_estimate --prompts DIR [--target data/demo/target]
        [--concurrency 32] [--max-new-tokens 512] [--module sglang.launch_server] [--json-out FILE]
    python -m tests.perf.bench_estimate --reproject ESTIMATE_JSON MEASURED_JSON   # on any machine

--prep DATA: the prep stage over the public samples in DATA (GSM8K, ShareGPT, Glaive, HumanEval;
../shared/data/README.md), tokenised for --target, written to --prompts; no server.

Otherwise one server of --target is launched (radix cache off: the estimate's sample does not
warm the run's prefixes) and the comparison runs (`compare`):

1. `python -m stages.commands.estimate --json-out` on a params file naming every prompts file
   of the folder as a dataset (no token budget), engine sglang at --concurrency: each dataset's
   projected hours, from its default sample (3 prompts per slot, spread over the file);
2. `python -m stages.generate` over each dataset, one after another, as `dvc repro` runs them:
   the generation loop's seconds (the report's tokens over its tokens/s) and the process's wall;
3. per dataset, projected over measured seconds: within 15% is the goal; beside it the
   projection's 10-90% range and whether the run fell in it, and what the projection was made
   of (prompts timed, the fitted pace with every slot busy and the share of a step that grows
   with the requests in it, how long the sample held every slot busy, the sample's seconds and
   the fitted server's seconds over it).

--reproject: this commit's projection of the samples an earlier estimate timed (the `spans` in
the estimate's own --json-out, kept under --work as estimate.json) against the generation loops
measured after it (this script's --json-out, or bench_client_vs_bare's with --estimate-prompts),
beside the projection made then: a change to the method, compared like with like on the same
samples. The same method gives the same seconds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from stages.serving.monitor import Backlog
from stages.serving.projection import project_sample
from tests.perf.bench_client_vs_bare import (
    DEMO_TARGET,
    launch,
    loop_seconds,
    on_cpu_target,
    stage_params,
)
from tests.perf.real_sglang import params, stage

# dataset -> (prep format, file under the data folder, prompts kept)
PUBLIC = {
    "gsm8k": ("gsm8k", "gsm8k/test.jsonl", 1319),
    "sharegpt": ("sharegpt", "sharegpt/ShareGPT_V3_filtered_500.json", 500),
    "glaive": ("glaive", "glaive/glaive_toolcall_en_demo.json", 300),
    "humaneval": ("humaneval", "humaneval/HumanEval.jsonl.gz", 164),
}
GOAL = 0.15


def prep(data: Path, out: Path, target: Path, work: Path) -> None:
    """The prep stage over PUBLIC's files under `data`, prompts for `target` written to `out`."""

    def change(p: dict) -> None:
        on_cpu_target(p, target)
        p["datasets"] = {
            name: dict(
                prep=dict(format=fmt, path=str(data / path), max_samples=n, max_prompt_tokens=1024),
                generate=dict(budget_tokens=10**12),
            )
            for name, (fmt, path, n) in PUBLIC.items()
        }

    params_file = params(work, "prep-params", change)
    out.mkdir(parents=True, exist_ok=True)
    for name in PUBLIC:
        args = ["--out", str(out / f"{name}.parquet"), "--report", str(work / f"prep-{name}.json")]
        stage(work, f"prep-{name}", "stages.prep", name, *args, "--params", str(params_file))
        print(f"[bench] prep {name}: {out / f'{name}.parquet'}", flush=True)


def compare(
    url: str, target: Path, prompts: Path, work: Path, concurrency: int, max_new: int = 512
) -> dict:
    """The estimate, then the run, of each prompts file in `prompts` on the server at `url`."""
    work.mkdir(parents=True, exist_ok=True)
    names = sorted(p.stem for p in prompts.glob("*.parquet"))
    params_file = str(stage_params(work, str(target), url, concurrency, max_new, names))
    projected_file = work / "estimate.json"
    started = time.monotonic()
    stage(
        work,
        "estimate",
        "stages.commands.estimate",
        *("--params", params_file, "--prompts-dir", str(prompts), "--raw-dir", str(work / "none")),
        *("--json-out", str(projected_file)),
        timeout_s=1800,
    )
    estimate_s = time.monotonic() - started
    projected = json.loads(projected_file.read_text())
    rows = []
    for p in projected["datasets"]:
        name = p["dataset"]
        report = work / f"generate-{name}.json"
        args = ["--prompts", str(prompts / f"{name}.parquet"), "--out", str(work / "raw" / name)]
        started = time.monotonic()
        stage(
            work,
            f"generate-{name}",
            "stages.generate",
            name,
            *args,
            "--report",
            str(report),
            "--params",
            params_file,
            timeout_s=3600,
        )
        wall = time.monotonic() - started
        ran = json.loads(report.read_text())
        loop_s = loop_seconds(ran)
        row = dict(
            dataset=name,
            prompts=ran["prompts"],
            projected_tokens=p["tokens_left"],
            tokens=ran["tokens"],
            projected_s=round(p["hours"] * 3600, 1),
            loop_s=round(loop_s, 1),
            process_wall_s=round(wall, 1),
            projected_vs_loop=round(p["hours"] * 3600 / loop_s, 3),
            range_s=[round(p["hours_low"] * 3600, 1), round(p["hours_high"] * 3600, 1)],
            in_range=p["hours_low"] * 3600 <= loop_s <= p["hours_high"] * 3600,
            sampled=p["samples"],
            pace_tokens_per_s=p["tokens_per_s"],
            step_share=p["step_share"],
            busy_s=p["busy_s"],
            sample_s=p["sample_s"],
            replayed_s=p["replayed_s"],
        )
        print(f"[bench] estimate {json.dumps(row)}", flush=True)
        rows.append(row)
    return dict(
        estimate=dict(
            settings=projected["settings"],
            notes=projected["notes"],
            estimate_s=round(estimate_s, 1),
        ),
        concurrency=concurrency,
        max_new_tokens=max_new,
        datasets=rows,
        within_goal=all(abs(r["projected_vs_loop"] - 1) <= GOAL for r in rows),
    )


def reproject(estimate_file: Path, measured_file: Path) -> list[dict]:
    """Each dataset of the estimate in `estimate_file` projected again from its spans, in the
    estimate's order and with its seed, against the loop `measured_file` holds for it."""
    estimate, measured = (json.loads(f.read_text()) for f in (estimate_file, measured_file))
    result = measured[-1] if isinstance(measured, list) else measured  # client_vs_bare: the last
    runs = {r["dataset"]: r for r in result["datasets"]}
    rng, slots, rows = random.Random(0), estimate["settings"]["slots"], []
    for d in estimate["datasets"]:
        name, spans = d["dataset"], [tuple(span) for span in d["spans"]]
        run = runs[name]
        prompt_tokens = round(d["mean_prompt_tokens"] * len(spans))
        backlog = Backlog(name, run["prompts"], 10**12)
        p = project_sample(
            name, spans, d["failed"], prompt_tokens, backlog, slots, result["max_new_tokens"], rng
        )
        rows.append(
            dict(
                dataset=name,
                prompts=run["prompts"],
                projected_then_s=round(d["hours"] * 3600, 2),
                projected_s=round(p.hours * 3600, 2),
                range_s=[round(p.hours_low * 3600, 2), round(p.hours_high * 3600, 2)],
                loop_s=run["loop_s"],
                projected_vs_loop=round(p.hours * 3600 / run["loop_s"], 3),
            )
        )
        print(f"[bench] reprojected {json.dumps(rows[-1])}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, help="a folder of prompts files")
    parser.add_argument("--reproject", type=Path, nargs=2, metavar=("ESTIMATE", "MEASURED"))
    parser.add_argument("--prep", type=Path, help="write --prompts from this data folder, and stop")
    parser.add_argument("--target", type=Path, default=DEMO_TARGET)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--module", default="sglang.launch_server")
    parser.add_argument(
        "--server-flags", nargs="*", default=["--disable-radix-cache", "--disable-cuda-graph"]
    )
    parser.add_argument("--mem-fraction", type=float, default=0.8)
    parser.add_argument("--port", type=int, default=30300)
    parser.add_argument("--health-timeout-s", type=float, default=900)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-estimate"))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.reproject:
        rows = reproject(*args.reproject)
        return 0 if all(abs(r["projected_vs_loop"] - 1) <= GOAL for r in rows) else 1
    if args.prompts is None:
        parser.error("--prompts is required (or --reproject)")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.prep:
        prep(args.prep, args.prompts, args.target, args.work)
        return 0
    url = f"http://127.0.0.1:{args.port}"
    server = launch(
        args, args.target, args.concurrency, args.server_flags, args.work / "server.log"
    )
    try:
        result = compare(
            url, args.target, args.prompts, args.work, args.concurrency, args.max_new_tokens
        )
    finally:
        server.stop()
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    print(
        "dataset  prompts  tokens projected | generated  "
        "seconds projected (10-90%) | loop | process  projected/loop"
    )
    for r in result["datasets"]:
        low, high = r["range_s"]
        print(
            f"{r['dataset']}  {r['prompts']}  {r['projected_tokens']:,.0f} | {r['tokens']:,}  "
            f"{r['projected_s']} ({low}-{high}) | {r['loop_s']} | {r['process_wall_s']}  "
            f"{r['projected_vs_loop']}"
        )
    return 0 if result["within_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
