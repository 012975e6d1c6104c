"""The generate stage against the server's own pace: the same requests sent through the stage as
users run it and through a bare concurrent /generate loop, output tokens/s of each, per target,
server kind and concurrency.

    python -m tests.perf.bench_client_vs_bare [--targets demo llama-3.1-8b]
        [--servers deterministic ordinary] [--concurrency 64 256] [--requests-per-slot 4]
        [--rounds 1] [--max-new-tokens 128] [--estimate-prompts DIR] [--estimate-slots 32]
        [--json-out FILE]

Per target and server kind one server is launched (`--module`, sglang.launch_server by default;
on the device one bundle of ../shared/sglang-h200 importable) with the radix cache off, so that a
run after another prefills the same prompts again; `deterministic` adds
--enable-deterministic-inference (batch-invariant kernels: greedy ids repeat whatever the batch),
`ordinary` is the server users run. Then per concurrency c, c x --requests-per-slot prompts of
random ids (lengths --prompt-lengths) are sent:

- warm-up: the bare loop over the first c prompts, untimed (kernels compile for these batches);
- bare: an aiohttp loop holding c requests in flight, each the body the stage sends (the same
  rid, ids and sampling values: engines/sglang_http.py `request_body`), nothing done with a
  reply but counting it;
- then --rounds times: the stage, `python -m stages.generate` in a process of its own, on a
  params file with engine sglang, the server's URL and concurrency c (resume bookkeeping, Parquet
  appends every append_every replies, the live monitor polling /metrics, the report): its own
  tokens/s (generation loop) and the process's wall seconds (imports, tokenizer, compaction:
  paid once a dataset); and the bare loop again.

The ratio is the stage runs' median against the bare runs' (the server's pace moves during a
call). Beside each run, two readings that tell the client's share from the server's:

- the requests the server held on average, its replies' e2e_latency summed over the run's
  seconds (the stage's: its loop's): where the stage holds fewer than the bare loop, it leaves
  slots empty between a reply and the next request;
- the server's own decode rate in that run's time, from its log's decode lines at c - 1 or more
  running requests: where it ran slower during the stage's runs at equal occupancy, the client
  is not what differs.

On the deterministic server every run must give the same output ids per sample, the proof that
they did the same work; the script exits 1 where they do not. On the ordinary server ids are not
compared (greedy ids there vary with the batch) and each run's token total is shown.

--estimate-prompts DIR: on the first target's ordinary server, after its table, the estimate
against the run (bench_estimate.compare) at concurrency --estimate-slots: `python -m
stages.commands.estimate` over the prompts files in DIR, then the generate stage over each
dataset in turn, projected seconds against measured.

The llama-3.1-8b target is random weights of Llama-3.1-8B's shape (tests/perf/bench_extract.py
SHAPES) saved in bf16 with the demo target's tokenizer, so replies run to max_new_tokens unless
the random model emits a stop id.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import re
import shutil
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import pyarrow.parquet as pq

from stages.artifacts.prompts import PromptSettings, write_prompts
from stages.engines.sglang_http import JSON_HEADERS, request_body
from stages.params.generate import GenerateParams
from stages.params.target import TargetParams
from stages.serving.launch import launch_command, start_server
from stages.wiring.engines import sampling_for
from stages.wiring.target import target_roles, target_tokenizer
from tests.perf.real_sglang import params, stage

ROOT = Path(__file__).resolve().parents[2]
DEMO_TARGET = ROOT / "data/demo/target"
DATASET = "bench"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def build_llama_8b(out: Path, shape: str) -> Path:
    """A random target of `shape` in bf16 on the GPU, saved with the demo target's tokenizer."""
    import torch

    from tests.perf.bench_extract import build_target

    if (out / "config.json").exists():
        return out
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_target(shape, device, torch.bfloat16)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (DEMO_TARGET / name).exists():
            shutil.copy(DEMO_TARGET / name, out / name)
    del model
    return out


def write_random_prompts(
    path: Path, n: int, lengths: tuple[int, int], vocab: int, dataset: str = DATASET
) -> list[dict]:
    """`n` prompts of random ids (seeded; ids above the special tokens), in the prompts schema."""
    rng = random.Random(0)
    rows = []
    for i in range(n):
        ids = [rng.randrange(64, vocab) for _ in range(rng.randint(*lengths))]
        rows.append(
            dict(
                sample_id=f"{dataset}/{i}",
                dataset=dataset,
                messages=json.dumps([{"role": "user", "content": f"random prompt {i}"}]),
                tools=None,
                prompt_ids=ids,
                prompt_len=len(ids),
                reasoning_open=False,
                turn_deltas=None,
                turn_messages=None,
            )
        )
    write_prompts(rows, path, PromptSettings())
    return rows


def on_cpu_target(p: dict, target: Path | str) -> None:
    """Params `p` read `target` as the generate stage's client does: its tokenizer, on the CPU."""
    p["target"].update(path=str(target), chat_template=None, device="cpu", dtype="auto")


def stage_params(
    work: Path, target: str, url: str, concurrency: int, max_new: int, datasets=(DATASET,)
) -> Path:
    """params.yaml for `datasets` generated through the server at `url`, with no budget limit."""

    def change(p: dict) -> None:
        source = next(iter(p["datasets"].values()))
        source["generate"]["budget_tokens"] = 10**12
        p["datasets"] = {name: copy.deepcopy(source) for name in datasets}
        on_cpu_target(p, target)
        p["generate"].update(engine="sglang", max_new_tokens=max_new, temperature=0.0)
        p["generate"]["sglang"].update(urls=[url], concurrency=concurrency, launch=None)

    return params(work, "params", change)


def launch(args, target: Path, max_running: int, flags: list[str], log: Path):
    """One server of `target` on --port (`--module`, --mem-fraction, metrics on), healthy."""
    server_args = dict(
        host="127.0.0.1",
        port=args.port,
        max_running_requests=max_running,
        mem_fraction_static=args.mem_fraction,
        enable_metrics=True,
    )
    command = launch_command(str(target), server_args, flags, module=args.module)
    return start_server(command, f"http://127.0.0.1:{args.port}", args.health_timeout_s, log)


def loop_seconds(report: dict) -> float:
    """The generation loop's seconds, from a generate report: its tokens over its tokens/s."""
    return report["tokens"] / report["tokens_per_s"]


def run_stage(work: Path, params_file: Path, prompts: Path) -> dict:
    """The generate stage in a process of its own: its report, wall seconds and output ids."""
    out, report = work / "raw", work / "report.json"
    shutil.rmtree(out, ignore_errors=True)
    report.unlink(missing_ok=True)
    args = [DATASET, "--prompts", str(prompts), "--out", str(out), "--report", str(report)]
    start, began = time.monotonic(), time.time()
    stage(work, "generate", "stages.generate", *args, "--params", str(params_file), timeout_s=3600)
    wall = time.monotonic() - start
    table = pq.read_table(sorted(out.glob("part-*.parquet"))[0])
    ids = dict(zip(table.column("sample_id").to_pylist(), table.column("output_ids").to_pylist()))
    report_json = json.loads(report.read_text())
    loop_s = loop_seconds(report_json)
    return dict(
        tokens=report_json["tokens"],
        tokens_per_s=report_json["tokens_per_s"],
        loop_s=loop_s,
        wall_s=wall,
        window=(began, time.time()),
        ids=ids,
        mean_in_flight=sum(table.column("latency_s").to_pylist()) / loop_s,
    )


async def _bare(
    url: str, rows: list[dict], sampling, concurrency: int
) -> dict[str, tuple[list[int], float]]:
    slots = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(row: dict) -> tuple[str, tuple[list[int], float]]:
            body = request_body(row["sample_id"], row["prompt_ids"], sampling, 0)
            post = session.post(f"{url}/generate", json=body, headers=JSON_HEADERS)
            async with slots, post as r:
                r.raise_for_status()
                reply = await r.json()
            return row["sample_id"], (reply["output_ids"], reply["meta_info"]["e2e_latency"])

        return dict(await asyncio.gather(*(one(row) for row in rows)))


def run_bare(url: str, rows: list[dict], sampling, concurrency: int) -> dict:
    start, began = time.monotonic(), time.time()
    replies = asyncio.run(_bare(url, rows, sampling, concurrency))
    wall = time.monotonic() - start
    ids = {k: output for k, (output, _) in replies.items()}
    tokens = sum(map(len, ids.values()))
    return dict(
        tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens / wall,
        window=(began, time.time()),
        ids=ids,
        mean_in_flight=sum(latency for _, latency in replies.values()) / wall,
    )


# SGLang's scheduler logs a decode line every few dozen steps (0.5.14-0.5.23):
# [2026-12-05 19:06:56] Decode batch, #running-req: 255, ..., gen throughput (token/s): 6838.46, ...
DECODE_LINE = re.compile(
    r"^\[(?P<when>[\d-]+ [\d:]+)\] Decode batch, #running-req: (?P<running>\d+),"
    r".*gen throughput \(token/s\): (?P<rate>[\d.]+)"
)


def server_decode_rate(log: Path, window: tuple[float, float], running: int) -> float | None:
    """The median decode rate the server logged within `window` (epoch seconds, its log's local
    time to the second) at `running` or more running requests; None where it logged none (the
    first line of a run, which counts the idle time before it, is left out)."""
    rates = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if m := DECODE_LINE.match(line):
            when = time.mktime(time.strptime(m["when"], "%Y-%m-%d %H:%M:%S"))
            if window[0] <= when <= window[1] + 1 and int(m["running"]) >= running:
                rates.append(float(m["rate"]))
    rates = rates[1:]
    return round(statistics.median(rates), 1) if rates else None


SERVERS = {"deterministic": ["--enable-deterministic-inference"], "ordinary": []}


def measure(args, name: str, target: Path, kind: str, work: Path) -> list[dict]:
    """One server of `kind` for `target`, then per concurrency: warm-up, bare, stage, bare."""
    target_params = TargetParams(path=str(target), device="cpu")
    tokenizer = target_tokenizer(target_params)
    roles = target_roles(target_params, tokenizer)
    url = f"http://127.0.0.1:{args.port}"
    flags = [*args.server_flags, *SERVERS[kind]]
    started = time.monotonic()
    server = launch(args, target, max(args.concurrency), flags, work / f"server-{name}-{kind}.log")
    print(
        f"[bench] {name} {kind}: server healthy in {time.monotonic() - started:.0f} s", flush=True
    )
    rows_out = []
    try:
        for c in args.concurrency:
            cwork = work / f"{name}-{kind}-c{c}"
            cwork.mkdir(parents=True, exist_ok=True)
            prompts = cwork / "prompts.parquet"
            rows = write_random_prompts(
                prompts, c * args.requests_per_slot, tuple(args.prompt_lengths), len(tokenizer)
            )
            params_file = stage_params(cwork, str(target), url, c, args.max_new_tokens)
            sampling = sampling_for(GenerateParams.read(params_file), roles)
            run_bare(url, rows[:c], sampling, c)  # warm-up
            runs = [run_bare(url, rows, sampling, c)]
            for _ in range(args.rounds):
                runs += [run_stage(cwork, params_file, prompts), run_bare(url, rows, sampling, c)]
            for run in runs:
                run["server_decode_tokens_per_s"] = server_decode_rate(
                    server.log_path, run["window"], c - 1
                )
            row = table_row(name, kind, c, runs)
            print(f"[bench] {json.dumps(row)}", flush=True)
            rows_out.append(row)
        if kind == "ordinary" and args.estimate_prompts and not args.estimated:
            args.estimated = True
            from tests.perf.bench_estimate import compare

            rows_out.append(
                compare(url, target, args.estimate_prompts, work / "estimate", args.estimate_slots)
            )
    finally:
        server.stop()
    return rows_out


def table_row(name: str, kind: str, c: int, runs: list[dict]) -> dict:
    """One line of the table: each run's rates (bare and stage alternating, bare first and last),
    the stage's median against the bare runs' median, the server's own decode rate per run, and
    whether every run got the same ids."""
    bare, staged = runs[0::2], runs[1::2]
    bare_rate = statistics.median(r["tokens_per_s"] for r in bare)
    stage_rate = statistics.median(r["tokens_per_s"] for r in staged)
    row = dict(
        target=name,
        server=kind,
        concurrency=c,
        requests=len(bare[0]["ids"]),
        bare_tokens_per_s=[round(r["tokens_per_s"], 1) for r in bare],
        stage_tokens_per_s=[r["tokens_per_s"] for r in staged],
        stage_vs_bare=round(stage_rate / bare_rate, 3),
        server_decode_tokens_per_s=[r["server_decode_tokens_per_s"] for r in runs],
        mean_in_flight=[round(r["mean_in_flight"], 1) for r in runs],
        stage_process_wall_s=[round(r["wall_s"], 2) for r in staged],
        stage_loop_s=[round(r["loop_s"], 2) for r in staged],
        tokens=[r["tokens"] for r in runs],
    )
    if kind == "deterministic":
        first = bare[0]["ids"]
        row["identical_rows"] = sum(
            all(r["ids"].get(k) == v for r in runs) for k, v in first.items()
        )
        row["same_ids"] = row["identical_rows"] == row["requests"] == len(staged[0]["ids"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["demo", "llama-3.1-8b"])
    parser.add_argument("--servers", nargs="+", choices=list(SERVERS), default=list(SERVERS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--requests-per-slot", type=int, default=4)
    parser.add_argument(
        "--rounds", type=int, default=1, help="stage runs, each followed by a bare one"
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt-lengths", type=int, nargs=2, default=[64, 512])
    parser.add_argument("--module", default="sglang.launch_server")
    parser.add_argument(
        "--server-flags",
        nargs="*",
        default=["--disable-radix-cache", "--disable-cuda-graph", "--attention-backend", "triton"],
        help="launch flags of both kinds (the device's bundles lack deep_gemm: no CUDA graphs; "
        "triton attention, the one the deterministic mode takes there)",
    )
    parser.add_argument("--mem-fraction", type=float, default=0.8)
    parser.add_argument("--port", type=int, default=30200)
    parser.add_argument("--health-timeout-s", type=float, default=900)
    parser.add_argument("--shape", default="llama-3.1-8b", help="the random target's shape")
    parser.add_argument("--estimate-prompts", type=Path, help="prompts files: the estimate vs run")
    parser.add_argument("--estimate-slots", type=int, default=32, help="its concurrency")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-client-vs-bare"))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    args.estimated = "ordinary" not in args.servers
    args.work.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    for name in args.targets:
        target = DEMO_TARGET if name == "demo" else build_llama_8b(args.work / name, args.shape)
        for kind in args.servers:
            results += measure(args, name, target, kind, args.work)
            if args.json_out:  # after each server: a call cut short keeps what it measured
                args.json_out.write_text(json.dumps(results, indent=2))
    table = [r for r in results if "server" in r]
    print(
        "target  server  in flight  bare tok/s  stage tok/s  stage/bare  server decode tok/s  "
        "mean in flight  stage loop s  stage process s  same ids"
    )
    for r in table:
        same = "not compared"
        if "same_ids" in r:
            same = f"{r['same_ids']} ({r['identical_rows']} of {r['requests']})"
        print(
            f"{r['target']}  {r['server']}  {r['concurrency']}  {r['bare_tokens_per_s']}  "
            f"{r['stage_tokens_per_s']}  {r['stage_vs_bare']}  {r['server_decode_tokens_per_s']}  "
            f"{r['mean_in_flight']}  {r['stage_loop_s']}  {r['stage_process_wall_s']}  {same}"
        )
    return 0 if all(r.get("same_ids", True) for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
