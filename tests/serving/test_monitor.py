"""The live monitor's numbers and ETAs, server metrics from /metrics, and the --estimate
projection."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from stages.commands import estimate
from stages.engines import Completion, Sampling
from stages.serving.monitor import Backlog, GenerationMonitor, backlog, parse_metrics, project_hours
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


def test_projected_hours_follow_the_measured_rate(hf_engine, prompts):
    samples = {"a": prompts[:3], "b": prompts[3:5]}
    backlogs = {"a": Backlog("a", 1000, 10**9), "b": Backlog("b", 10, 20)}
    rate, projections = project_hours(hf_engine, Sampling(max_new_tokens=6), samples, backlogs)
    by = {p.dataset: p for p in projections}
    assert (by["a"].samples, by["b"].samples) == (3, 2)
    assert by["a"].mean_output_tokens == by["b"].mean_output_tokens == 6  # no stop token
    assert by["a"].tokens_left == 6000 and by["b"].tokens_left == 20  # budget-bound
    for p in projections:
        assert p.hours == pytest.approx(p.tokens_left / rate / 3600)


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
    assert "generated tokens/s over 4 samples" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("t "))
    assert row[:5] == ["t", "4", "0", "4", "48"]  # 12 prompts left * 4 tokens, under the budget
