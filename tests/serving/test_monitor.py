"""The live monitor's numbers and ETAs, server metrics from /metrics, and the --estimate
projection."""

from __future__ import annotations

import io
import json

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
    makespan,
    parse_metrics,
    project_hours,
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


class Timed:
    """An engine whose requests take the latencies given, in turn, each `out` tokens long."""

    name = "timed"

    def __init__(self, latencies: list[float], out: int, slots: int):
        self.latencies, self.out, self.slots = latencies, out, slots

    def generate(self, requests, sampling):
        for i, (sid, _) in enumerate(requests):
            yield Completion(sid, [1] * self.out, "length", self.latencies[i % len(self.latencies)])


def test_makespan_keeps_every_slot_busy_and_pays_the_longest_last():
    assert makespan([2.0], requests=10, slots=4) == 6.0  # ceil(10 / 4) rounds of 2 s
    assert makespan([10.0, 1.0, 1.0, 1.0], requests=4, slots=4) == 10.0  # one long reply
    # 3 slots, durations 3,1,1,3,1,1: slot A 3; B 1 then 3 (ends 4); C 1, 1, 1 (ends 3)
    assert makespan([3.0, 1.0, 1.0], requests=6, slots=3) == 4.0
    # past the simulated requests, each adds its mean latency over the slots
    assert makespan([2.0], requests=1010, slots=10, exact_up_to=1000) == 200.0 + 2.0
    assert makespan([], requests=5, slots=2) == makespan([1.0], requests=0, slots=2) == 0.0


def test_projection_replays_the_sample_latencies_over_the_backlog():
    engine = Timed([4.0, 2.0], out=10, slots=2)
    samples = {"a": [(f"a/{i}", [0] * 5) for i in range(4)], "b": [("b/0", [0] * 3)]}
    backlogs = {"a": Backlog("a", 9, 10**9), "b": Backlog("b", 100, 35)}
    by = {p.dataset: p for p in project_hours(engine, Sampling(10), samples, backlogs, 2)}
    # a: 9 requests of 4, 2, 4, 2... s over 2 slots, each to the slot free first: ends at
    # 4, 2 | 6, 6 | 10, 8 | 12, 12 | 16 (28 s of work over 2 slots, and a tail of 2)
    assert (by["a"].samples, by["a"].requests_left, by["a"].tokens_left) == (4, 9, 90)
    assert by["a"].hours * 3600 == pytest.approx(16.0)
    assert by["a"].mean_prompt_tokens == 5 and by["a"].mean_output_tokens == 10
    # b: the budget's 35 tokens are 4 replies of 10; b's sample only saw 4 s latencies
    assert (by["b"].requests_left, by["b"].tokens_left) == (4, 35)
    assert by["b"].hours * 3600 == pytest.approx(8.0)


def test_projection_of_the_hf_engine_is_its_batches(hf_engine, prompts):
    """Each completion of a batch carries the batch's time: N requests take ceil(N / batch)
    batches."""
    timed = []

    class Recording:
        name, slots = "hf", hf_engine.slots

        def generate(self, requests, sampling):
            for completion in hf_engine.generate(requests, sampling):
                timed.append(completion.latency_s)
                yield completion

    backlogs = {"a": Backlog("a", 20, 10**9)}
    (p,) = project_hours(Recording(), Sampling(6), {"a": prompts[:3]}, backlogs, hf_engine.slots)
    assert p.mean_output_tokens == 6 and p.requests_left == 20  # no stop token
    assert len(set(timed)) == 1 and hf_engine.slots == 8  # one batch of 3
    assert p.hours * 3600 == pytest.approx(3 * timed[0])  # ceil(20 / 8) batches


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
        samples=4, params=params, prompts_dir=prompts_file.parent, raw_dir=tmp_path / "raw"
    )
    out = capsys.readouterr().out
    assert "[estimate] hf: 4 requests generated at once (generate.batch_size 4)" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("t "))
    # 4 timed, 12 prompts left of 4 tokens each, under the budget, in 3 batches of 4
    assert row[:3] + row[4:7] == ["t", "4", "0", "4", "12", "48"]


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
    assert row["samples"] == 3 and row["failed"] == 0  # the default sample: one per slot
    per_request = row["mean_prompt_tokens"] + row["mean_output_tokens"]
    assert 64 / per_request < 3  # the cache holds fewer of these than the 3 sent at once
    (note,) = written["notes"]
    assert note.startswith(f"t: {server.url}'s KV cache holds about {64 / per_request:,.0f} of")
