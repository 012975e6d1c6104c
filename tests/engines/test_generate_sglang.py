"""The generate stage through SGLang's API: the same samples as the in-process engine, a server
launched from params, the budget, and a server killed mid-run costing no sample and no duplicate."""

from __future__ import annotations

import dataclasses

import pytest

from stages import generate
from stages.artifacts.raw import parts, read_raw
from stages.config import GenerateParams, SGLangLaunchParams, SGLangParams, SGLangServerArgs
from stages.engines import sglang_server
from stages.engines.sglang import SGLangError
from tests.engines.conftest import free_port

# every test runs the stage against a real local server that decodes with the target
pytestmark = [pytest.mark.integration, pytest.mark.slow]
HF = GenerateParams(engine="hf", batch_size=4, max_new_tokens=12, append_every=2)
FAST_RETRIES = dict(concurrency=3, backoff_s=0.001, backoff_max_s=0.01)


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
    """An engine whose server is killed (and maybe restarted) after `k` completions."""

    def __init__(self, engine, k: int, kill):
        self.engine, self.k, self.kill = engine, k, kill
        self.name, self.urls = engine.name, engine.urls

    def generate(self, requests, sampling):
        for n, done in enumerate(self.engine.generate(requests, sampling), 1):
            yield done
            if n == self.k:
                self.kill()


def test_stage_via_local_server_gives_the_hf_engine_samples(
    tmp_path, prompts_file, target, reference, serve, capsys
):
    server = serve()
    out = tmp_path / "raw-sglang"
    metrics = generate.generate_dataset("t", prompts_file, out, via(server.url), 10**6, target)
    assert samples(out) == reference
    assert metrics["engine"] == "sglang" and metrics["failed"] == 0
    assert set(read_raw(out).column("engine").to_pylist()) == {"sglang"}
    assert f"[generate t] {len(reference)}/{len(reference)} samples" in capsys.readouterr().err


def test_stage_launches_the_server_from_params_and_stops_it(
    tmp_path, prompts_file, target, reference, monkeypatch
):
    launched, start = [], sglang_server.start_server

    def start_and_keep(*args, **options):
        launched.append(start(*args, **options, poll_s=0.1))
        return launched[-1]

    monkeypatch.setattr(sglang_server, "start_server", start_and_keep)
    args = SGLangServerArgs(
        port=free_port(),
        max_running_requests=8,
        context_length=512,
        mem_fraction_static=0.5,
        enable_hierarchical_cache=True,
        hicache_size=4,
    )
    launch = SGLangLaunchParams(
        module="stages.engines.hf_server",
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
        assert sglang_server.is_healthy(server.url)
    finally:
        for server in launched:
            server.stop()
    assert samples(out) == reference
    assert server.process.poll() is not None and not sglang_server.is_healthy(server.url)


def test_budget_stops_scheduling_and_the_overshoot_is_reported(
    tmp_path, prompts_file, target, serve
):
    out = tmp_path / "raw"
    metrics = generate.generate_dataset("t", prompts_file, out, via(serve().url), 30, target)
    assert metrics["budget_reached"] and metrics["tokens"] >= 30
    assert metrics["budget_overshoot_tokens"] == metrics["tokens"] - 30
    # rows are in completion order: after the one that reached the budget, only requests
    # already in flight may finish
    lengths = read_raw(out).column("completion_tokens").to_pylist()
    reached = next(n for n in range(1, len(lengths) + 1) if sum(lengths[:n]) >= 30)
    assert metrics["samples"] <= reached + FAST_RETRIES["concurrency"] - 1 < metrics["prompts"]


def test_server_restarted_within_the_retry_window_costs_nothing(
    tmp_path, prompts_file, target, reference, serve
):
    first = serve()
    port = int(first.url.rsplit(":", 1)[1])

    def restart():
        first.stop()
        serve(port=port)

    engine = generate.make_engine(via(first.url), target, None)
    out = tmp_path / "raw"
    metrics = generate.generate_dataset(
        "t", prompts_file, out, HF, 10**6, target, engine=KilledAfter(engine, 3, restart)
    )
    assert samples(out) == reference and metrics["new_samples"] == len(reference)
    assert engine.retries >= 1


def test_server_killed_mid_run_then_rerun_loses_and_duplicates_nothing(
    tmp_path, prompts_file, target, reference, serve
):
    first = serve()
    out = tmp_path / "raw"
    engine = generate.make_engine(via(first.url, max_retries=1), target, None)
    with pytest.raises(SGLangError, match="attempts failed"):
        generate.generate_dataset(
            "t", prompts_file, out, HF, 10**6, target, engine=KilledAfter(engine, 5, first.stop)
        )
    kept = samples(out)
    assert 4 <= len(kept) < len(reference) and len(parts(out)) >= 2
    assert all(reference[sid] == sample for sid, sample in kept.items())

    second = serve()
    metrics = generate.generate_dataset("t", prompts_file, out, via(second.url), 10**6, target)
    assert samples(out) == reference
    assert metrics["new_samples"] == len(reference) - len(kept)
    assert second.stats["completed"] == len(reference) - len(kept)
    assert len(parts(out)) == 1
