"""The generate stage through SGLang's API: the same samples as the in-process engine, a server
launched from params, the budget, a server gone for a second costing nothing, and a server gone
for good failing the stage naming it while keeping every reply back, the rerun losing and
duplicating nothing."""

from __future__ import annotations

import dataclasses
import re
import threading

import pytest

from stages import generate
from stages.artifacts.raw import parts, read_raw
from stages.engines.sglang_http import SGLangError
from stages.params.generate import GenerateParams, SGLangParams
from stages.params.server import SGLangLaunchParams, SGLangServerArgs
from stages.serving.launch import is_healthy
from stages.wiring import engines as wiring_engines
from stages.wiring.engines import make_engine
from tests.engines.conftest import free_port

# every test runs the stage against a real local server that decodes with the target
pytestmark = [pytest.mark.integration, pytest.mark.slow]
HF = GenerateParams(engine="hf", batch_size=4, max_new_tokens=12, append_every=2)
FAST_RETRIES = dict(concurrency=3, backoff_s=0.001, backoff_max_s=0.01)
DOWNTIME_S = 1.0


def via(*urls: str, **options) -> GenerateParams:
    return dataclasses.replace(
        HF, engine="sglang", sglang=SGLangParams(urls=list(urls), **FAST_RETRIES | options)
    )


def samples(out_dir) -> dict[str, tuple[list[int], str]]:
    table = read_raw(out_dir)
    ids = table.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)), "duplicate samples"
    return dict(
        zip(
            ids,
            zip(
                table.column("output_ids").to_pylist(),
                table.column("finish_reason").to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prompts_file, target, hf_engine):
    out = tmp_path_factory.mktemp("raw-hf")
    generate.generate_dataset("t", prompts_file, out, HF, 10**6, target, engine=hf_engine)
    return samples(out)


class KilledAfter:
    """An engine whose server is killed (and maybe restarted) after `k` completions; `yielded`
    counts the completions it handed to the stage."""

    def __init__(self, engine, k: int, kill):
        self.engine, self.k, self.kill = engine, k, kill
        self.name, self.urls, self.facts = engine.name, engine.urls, engine.facts
        self.yielded = 0

    def generate(self, requests, sampling):
        for done in self.engine.generate(requests, sampling):
            self.yielded += 1
            yield done
            if self.yielded == self.k:
                self.kill()


def test_stage_via_local_server_gives_the_hf_engine_samples(
    tmp_path, prompts_file, target, reference, serve, capsys
):
    server = serve()
    out = tmp_path / "raw-sglang"
    metrics = generate.generate_dataset("t", prompts_file, out, via(server.url), 10**6, target)
    assert samples(out) == reference
    assert metrics.engine == "sglang" and metrics.failed == 0
    assert set(read_raw(out).column("engine").to_pylist()) == {"sglang"}
    assert f"[generate t] {len(reference)}/{len(reference)} samples" in capsys.readouterr().err


def test_stage_launches_the_server_from_params_and_stops_it(
    tmp_path, prompts_file, target, reference, monkeypatch
):
    launched, start = [], wiring_engines.start_server

    def start_and_keep(*args, **options):
        launched.append(start(*args, **options, poll_s=0.1))
        return launched[-1]

    monkeypatch.setattr(wiring_engines, "start_server", start_and_keep)
    args = SGLangServerArgs(
        port=free_port(),
        max_running_requests=8,
        context_length=512,
        mem_fraction_static=0.5,
        enable_hierarchical_cache=True,
        hicache_size=4,
    )
    launch = SGLangLaunchParams(
        module="tests.doubles.hf_server",
        server_args=args,
        health_timeout_s=60,
        log_file=str(tmp_path / "server.log"),
    )
    gen = dataclasses.replace(
        HF, engine="sglang", sglang=SGLangParams(**FAST_RETRIES, launch=launch)
    )
    out = tmp_path / "raw-launched"
    try:
        generate.generate_dataset("t", prompts_file, out, gen, 10**6, target)
        (server,) = launched
        assert server.url == f"http://127.0.0.1:{args.port}"
        assert is_healthy(server.url)
    finally:
        for server in launched:
            server.stop()
    assert samples(out) == reference
    assert server.process.poll() is not None and not is_healthy(server.url)


def test_budget_stops_scheduling_and_the_overshoot_is_reported(
    tmp_path, prompts_file, target, serve
):
    out = tmp_path / "raw"
    metrics = generate.generate_dataset("t", prompts_file, out, via(serve().url), 30, target)
    assert metrics.budget_reached and metrics.tokens >= 30
    assert metrics.budget_overshoot_tokens == metrics.tokens - 30
    # rows are in completion order: after the one that reached the budget, only requests
    # already in flight may finish
    lengths = read_raw(out).column("completion_tokens").to_pylist()
    reached = next(n for n in range(1, len(lengths) + 1) if sum(lengths[:n]) >= 30)
    assert metrics.samples <= reached + FAST_RETRIES["concurrency"] - 1 < metrics.prompts


def test_server_gone_for_a_second_then_back_costs_nothing(
    tmp_path, prompts_file, target, reference, serve
):
    """Killed after 3 replies, back on its port a second later: the requests in flight and those
    sent meanwhile are retried until it answers."""
    first = serve()
    back = threading.Timer(DOWNTIME_S, serve, kwargs=dict(port=int(first.url.rsplit(":", 1)[1])))

    def stop_until_later():
        first.stop()
        back.start()

    # 61 attempts, 53 of them up to 0.1 s apart: about 2.7 s before a request gives up; all of
    # them within the second the server is gone has a chance of about 1e-17
    engine = make_engine(via(first.url, max_retries=60, backoff_max_s=0.1), target, None)
    out = tmp_path / "raw"
    metrics = generate.generate_dataset(
        "t", prompts_file, out, HF, 10**6, target, engine=KilledAfter(engine, 3, stop_until_later)
    )
    back.join()
    assert samples(out) == reference and metrics.new_samples == len(reference)
    assert engine.retries >= 1


def test_server_killed_mid_run_then_rerun_loses_and_duplicates_nothing(
    tmp_path, prompts_file, target, reference, serve
):
    """Gone for good after 5 replies: the stage fails once a request has used its retries,
    naming the server and its last error, and keeps all 5 (append_every is 2)."""
    first = serve()
    out = tmp_path / "raw"
    engine = make_engine(via(first.url, max_retries=1), target, None)
    killed = KilledAfter(engine, 5, first.stop)
    url = re.escape(first.url)
    with pytest.raises(
        SGLangError,
        match=rf"sample t/\d+: 2 attempts failed, the last: {url}: \w+Error: .+\. "
        rf"Check that the servers \({url}\) are up",
    ):
        generate.generate_dataset("t", prompts_file, out, HF, 10**6, target, engine=killed)
    kept = samples(out)
    assert len(kept) == killed.yielded >= 5 and len(kept) < len(reference)
    assert len(parts(out)) >= 3
    assert all(reference[sid] == sample for sid, sample in kept.items())

    second = serve()
    metrics = generate.generate_dataset("t", prompts_file, out, via(second.url), 10**6, target)
    assert samples(out) == reference
    assert metrics.new_samples == len(reference) - len(kept)
    assert second.stats["completed"] == len(reference) - len(kept)
    assert len(parts(out)) == 1
