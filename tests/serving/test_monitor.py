"""The live monitor's numbers and ETAs, server metrics from /metrics, and the --estimate
projection."""

from __future__ import annotations

import io
import json
import random
import statistics

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from stages.commands import estimate
from stages.engines import Completion, Sampling
from stages.serving.monitor import (
    Backlog,
    GenerationMonitor,
    backlog,
    parse_metrics,
)
from stages.serving.projection import (
    Steps,
    fit_steps,
    project_hours,
    project_sample,
    replay_seconds,
    run_hours,
)
from tests.rawdata import raw_row, write_raw


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_parse_metrics_sums_label_sets_and_skips_comments():
    text = (
        "# HELP sglang:num_running_reqs running\n# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="0",dp="0"} 12.0\n'
        'sglang:num_running_reqs{tp_rank="0",dp="1"} 7.0\nsglang:token_usage 0.5\n\n'
    )
    assert parse_metrics(text) == {
        "sglang:num_running_reqs": [12.0, 7.0],
        "sglang:token_usage": [0.5],
    }


def test_live_line_counts_rates_failures_and_etas():
    clock, out = Clock(), io.StringIO()
    live = GenerationMonitor(
        "a",
        total_samples=10,
        done_samples=2,
        budget_tokens=1000,
        used_tokens=100,
        others=[Backlog("b", 5, 500), Backlog("a", 9, 9)],
        every_s=30,
        stream=out,
        clock=clock,
    )
    for ids in ([1] * 60, [1] * 40, [], [1] * 100):
        clock.now += 2.5
        live.update(Completion("x", ids, "abort" if not ids else "length", 0.1))
    assert out.getvalue() == ""  # not yet every_s
    line = live.line()
    # 4 done in 10 s: 200 tokens, 20 tok/s, mean 50; a: 4 prompts left -> 200 tokens = 10 s;
    # b: min(500, 5 * 50) = 250 more tokens -> run 450 tokens = 22 s
    assert line == (
        "[generate a] 6/10 samples  300/1,000 tokens  20 tok/s  24.0 done/min  "
        "mean 50 tok  failed 1  eta 0:00:10  run eta 0:00:22"
    )
    clock.now += 30
    live.update(Completion("x", [1] * 50, "stop", 0.1))
    assert out.getvalue().startswith("[generate a] 7/10 samples  350/1,000 tokens")


def test_the_budget_bounds_the_eta_and_no_rate_means_no_eta():
    live = GenerationMonitor("a", 100, 0, budget_tokens=120, used_tokens=0, clock=Clock())
    assert "eta ?  run eta ?" in live.line()
    live.update(Completion("x", [1] * 100, "length", 0.1))
    live.clock.now += 10
    assert "eta 0:00:02  run eta 0:00:02" in live.line()  # 20 tokens left at 10 tok/s
    done = GenerationMonitor("a", 5, 5, budget_tokens=120, used_tokens=50, clock=Clock())
    assert "eta 0:00:00  run eta 0:00:00" in done.line()


@pytest.mark.integration
def test_server_metrics_join_the_line_and_servers_without_them_are_dropped(serve):
    server = serve()
    live = GenerationMonitor("a", 1, 0, 10, 0, metrics_urls=[server.url, f"{server.url}/nope"])
    assert live.line().endswith("servers: running 0  queued 0  kv 0%")
    assert live.server.urls == [server.url]


def test_backlog_from_prompts_and_raw_parts(tmp_path):
    prompts = tmp_path / "p.parquet"
    pq.write_table(pa.table({"sample_id": [f"d/{i}" for i in range(5)]}), prompts)
    write_raw(tmp_path / "raw", [raw_row("d", 0, output_len=30), raw_row("d", 1, output_len=20)])
    assert backlog("d", 100, prompts, tmp_path / "raw") == Backlog("d", 3, 50)
    assert backlog("e", 100, tmp_path / "none.parquet", tmp_path / "none") == Backlog("e", 0, 100)
    assert Backlog("d", 3, 50).tokens(10) == 30 and Backlog("d", 3, 50).tokens(40) == 50


class Batching:
    """A continuous-batching server on a virtual clock: every step adds one token to each running
    request and takes longer the more run (`base` + `per_request` x running seconds); a request
    ends at its length, and the next waiting one starts at once. Its first step ever also pays
    `compile_s`, as a fresh server compiles its first kernels."""

    name = "batching"

    def __init__(self, lengths: dict[str, int], slots: int, clock: Clock, compile_s: float = 0.0):
        self.lengths, self.slots, self.clock = lengths, slots, clock
        self.base, self.per_request, self.compile_s = 0.02, 0.001, compile_s

    def generate(self, requests, sampling):
        pending, running = iter(requests), {}  # sample id -> [tokens left, start]

        def fill():
            while len(running) < self.slots and (request := next(pending, None)):
                running[request[0]] = [self.lengths[request[0]], self.clock.now]

        fill()
        while running:
            self.clock.now += self.base + self.per_request * len(running) + self.compile_s
            self.compile_s = 0.0
            for state in running.values():
                state[0] -= 1
            for sid in [sid for sid, (left, _) in running.items() if left == 0]:
                latency = self.clock.now - running.pop(sid)[1]
                yield Completion(sid, [1] * self.lengths[sid], "length", latency)
                fill()


def _fresh_run(lengths: dict[str, int], slots: int = 32) -> tuple[Batching, Clock]:
    clock = Clock()
    return Batching(lengths, slots, clock, compile_s=120.0), clock


def _run_seconds(run: Batching, clock: Clock, rows) -> float:
    start = clock.now
    for _ in run.generate(rows, Sampling(512)):
        pass
    return clock.now - start


def test_projection_fits_the_servers_steps_and_replays_the_run():
    """Against the run that follows it on the simulated server, fresh (its first step compiles
    for two minutes): 2,000 prompts of 20-400 tokens, 32 at once, projected from a sample of 96
    spread over them. The fit finds the simulator's own step (0.02 s + 0.001 s a request)."""
    rng = random.Random(0)
    rows = [(f"d/{i}", [0] * rng.randint(50, 500)) for i in range(2000)]
    run, clock = _fresh_run({sid: rng.randint(20, 400) for sid, _ in rows})
    sample = rows[:: len(rows) // 96][:96]
    backlogs = {"d": Backlog("d", len(rows), 10**12)}
    (p,) = project_hours(run, Sampling(400), {"d": sample}, backlogs, clock=clock)
    generated = sum(run.lengths.values())
    run_s = _run_seconds(run, clock, rows)
    assert 600 < run_s < 800  # so the compile, if the estimate timed it, would be 15-20% of it
    assert p.samples == 96 and p.requests_left == len(rows) and p.busy_s > 0
    assert p.tokens_per_s == pytest.approx(32 / (0.02 + 0.001 * 32), rel=0.01)
    assert p.step_share == pytest.approx(0.032 / 0.052, abs=0.01)
    assert p.replayed_s == pytest.approx(p.sample_s, rel=0.01)
    assert p.tokens_left == pytest.approx(generated, rel=0.05)
    assert p.hours * 3600 == pytest.approx(run_s, rel=0.05)
    assert p.hours_low * 3600 <= run_s <= p.hours_high * 3600


@pytest.mark.parametrize("prompts, at_limit", [(225, 0.02), (1319, 0.01)])
def test_projection_with_replies_at_the_limit_holds_its_range(prompts, at_limit):
    """Most replies 20-120 tokens, a few at the 512-token limit: one such reply holds a slot for
    much of a short run, and a 96-prompt sample often sees none of them. 225 prompts is Glaive's
    on the demo, 1,319 GSM8K's. Over 20 datasets drawn so, the projection's median is the run's
    and its 10-90% range holds most runs."""
    ratios, held = [], 0
    for seed in range(20):
        rng = random.Random(seed)
        rows = [(f"g/{i}", [0] * 100) for i in range(prompts)]
        long = {sid for sid, _ in rows if rng.random() < at_limit}
        run, clock = _fresh_run({s: 512 if s in long else rng.randint(20, 120) for s, _ in rows})
        backlogs = {"g": Backlog("g", len(rows), 10**12)}
        sample = rows[:: len(rows) // 96][:96]
        (p,) = project_hours(run, Sampling(512), {"g": sample}, backlogs, clock=clock)
        run_s = _run_seconds(run, clock, rows)
        ratios.append(p.hours * 3600 / run_s)
        held += p.hours_low * 3600 <= run_s <= p.hours_high * 3600
    assert statistics.median(ratios) == pytest.approx(1.0, abs=0.1)
    assert held >= 14


def test_the_whole_runs_range_holds_the_datasets_run_one_after_another():
    """Two datasets as the run generates them, one after the other, a few replies at the limit
    in each: over 20 such runs, the run's range (the datasets' redraws summed) holds most, and
    is narrower than the datasets' ranges added up, in which every dataset draws its long
    replies at once."""
    held, narrower = 0, 0
    for seed in range(20):
        rng = random.Random(seed)
        rows = {d: [(f"{d}/{i}", [0] * 100) for i in range(n)] for d, n in (("a", 225), ("b", 484))}
        every = [sid for part in rows.values() for sid, _ in part]
        lengths = {s: 512 if rng.random() < 0.02 else rng.randint(20, 120) for s in every}
        run, clock = _fresh_run(lengths)
        backlogs = {d: Backlog(d, len(part), 10**12) for d, part in rows.items()}
        samples = {d: part[:: len(part) // 96][:96] for d, part in rows.items()}
        projections = project_hours(run, Sampling(512), samples, backlogs, clock=clock)
        run_s = sum(_run_seconds(run, clock, part) for part in rows.values())
        _, low, high = run_hours(projections)
        held += low * 3600 <= run_s <= high * 3600
        narrower += (
            sum(p.hours_low for p in projections)
            < low
            < high
            < sum(p.hours_high for p in projections)
        )
    assert held >= 14 and narrower == 20


def test_the_hf_engines_batches_project_as_batches(hf_engine, prompts):
    """8 prompts, one full batch of 8, no stop token within 6 tokens: 20 prompts are 3 such
    batches. 3 prompts never fill the batch, which the estimate marks."""
    backlogs = {"a": Backlog("a", 20, 10**9)}
    (p,) = project_hours(hf_engine, Sampling(6), {"a": prompts[:8]}, backlogs)
    assert p.mean_output_tokens == 6 and p.requests_left == 20 and p.busy_s > 0
    batch_s = max(end for _, end, _ in p.spans) - min(start for start, _, _ in p.spans)
    assert p.hours * 3600 == pytest.approx(3 * batch_s, rel=0.02)
    assert p.hours_low == pytest.approx(p.hours_high) == p.hours  # one length: redraws alike
    (short,) = project_hours(hf_engine, Sampling(6), {"a": prompts[:3]}, backlogs)
    assert short.busy_s == 0


def test_a_sample_of_empty_replies_names_its_dataset():
    with pytest.raises(ValueError, match="^empty: the sample's replies took no time or gave no"):
        project_sample(
            "empty", [(0.0, 1.0, 0)] * 3, 0, 30, Backlog("empty", 9, 99), 2, 8, random.Random()
        )


def test_the_fit_and_the_replay_on_spans_worked_by_hand():
    """Two slots, a step of 1 s whatever runs: a request of 2 tokens alone, then two of 1 token
    together; the replay sends 3 tokens and 1 token into 2 slots (3 steps)."""
    steps = fit_steps([(0.0, 2.0, 2), (2.0, 3.0, 1), (2.0, 3.0, 1)], slots=2)
    assert steps.full_s == pytest.approx(1.0) and steps.share == 0.0
    assert replay_seconds([3, 1], steps) == pytest.approx(3.0)
    assert replay_seconds([1, 1, 1], Steps(1.0, 1.0, 2)) == pytest.approx(1.0 + 0.5)


def test_estimate_cli(tmp_path, target, prompts_file, capsys):
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "target": {
                    "path": target.path,
                    "chat_template": target.chat_template,
                    "device": "cpu",
                    "dtype": "float32",
                },
                "datasets": {
                    "t": {
                        "prep": {"format": "sharegpt", "path": "x"},
                        "generate": {"budget_tokens": 500},
                    }
                },
                "generate": {"engine": "hf", "max_new_tokens": 4, "batch_size": 4},
            }
        )
    )
    estimate.main(
        samples=3, params=params, prompts_dir=prompts_file.parent, raw_dir=tmp_path / "raw"
    )
    out = capsys.readouterr().out
    assert "[estimate] hf: 4 requests generated at once (generate.batch_size 4)" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("t "))
    # 3 timed, 12 prompts left of 4 tokens each, under the budget; 3 prompts never fill the
    # batch of 4: the pace is extrapolated (*)
    assert row[:3] + row[4:5] + row[6:8] == ["t", "3", "0", "4", "12", "48"]
    assert row[5].endswith("*") and "raise --samples" in out


@pytest.mark.integration
def test_estimate_through_a_server_states_what_it_assumed(
    tmp_path, serve, target, prompts_file, capsys
):
    server = serve(context_length=32, max_running_requests=2)
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "target": {"path": target.path, "chat_template": target.chat_template},
                "datasets": {"t": {"prep": {"format": "sharegpt", "path": "x"}, "generate": {}}},
                "generate": {
                    "engine": "sglang",
                    "max_new_tokens": 4,
                    "sglang": {"urls": [server.url], "concurrency": 3},
                },
            }
        )
    )
    out_json = tmp_path / "estimate.json"
    estimate.main(
        params=params, prompts_dir=prompts_file.parent, raw_dir=tmp_path / "raw", json_out=out_json
    )
    out = capsys.readouterr().out
    assert (
        "sglang: 3 requests generated at once (1 server(s) x generate.sglang.concurrency 3)" in out
    )
    said = f"{server.url} (/server_info): context length 32, KV cache 64 tokens, max running "
    assert f"[estimate] {said}requests 2" in out
    written = json.loads(out_json.read_text())
    assert written["settings"]["servers"] == {
        server.url: {"context_length": 32, "kv_cache_tokens": 64, "max_running_requests": 2}
    }
    (row,) = written["datasets"]
    assert row["samples"] == 9 and row["failed"] == 0  # the default sample: 3 per slot
    per_request = row["mean_prompt_tokens"] + row["mean_output_tokens"]
    assert 64 / per_request < 3  # the cache holds fewer of these than the 3 sent at once
    kv_notes = [n for n in written["notes"] if f"{server.url}'s KV cache" in n]
    assert kv_notes == [
        f"t: {server.url}'s KV cache holds about {64 / per_request:,.0f} of its requests at once, "
        "under the 3 sent to it: the rest queue in the server (the timed sample includes that wait)"
    ]
    assert len(row["spans"]) == 9  # what the projection was fitted to, to check it otherwise
