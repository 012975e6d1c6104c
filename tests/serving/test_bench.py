"""The benchmark's sglang mode against real local servers of stories260K, one decoding with an
exported drafter (hf_server's --speculative-* mode) and one without: tau from meta_info equals the
in-process count on the same prompts (the prefill token aside), a server without speculation is
refused with the reason, and launch mode starts both servers in turn with the commands reported."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from stages import benchmark
from stages.cli import StageError
from stages.drafter.export import export_drafter, load_drafter
from stages.drafter.model import Eagle3Config, Eagle3Drafter
from stages.engines import Completion, Sampling
from stages.engines.hf import HFEngine
from stages.engines.sglang_http import Reply, SGLangError
from stages.params.benchmark import BenchmarkParams, BenchmarkSGLangParams
from stages.params.server import SGLangLaunchParams
from stages.params.target import TargetParams
from stages.reports.benchmark import GREEDY
from stages.reports.record import encode
from stages.serving.bench import (
    ServerRun,
    acceptance,
    check_speculative_server,
    measure,
    server_facts,
)
from stages.serving.launch import Speculation, is_healthy
from stages.target_model.model import load_causal_lm
from stages.target_model.tokenizer import pad_id, render_prompt
from stages.wiring import benchmark as measured
from stages.wiring.target import target_roles, target_tokenizer
from tests.conftest import STORIES, STORIES_REL
from tests.doubles import hf_server
from tests.doubles.hf_server import HFServer, Speculative, model_eos_ids
from tests.engines.conftest import client, free_port

TEMPLATE = Path(__file__).parents[1] / "fixtures" / "stories_chat_template.jinja"
NUM_STEPS, MAX_NEW_TOKENS, DRAFT_VOCAB = 3, 40, 32
OPENINGS = {
    "tales": [
        "Once upon a time there was a cat",
        "The little girl saw a big dog",
        "Tom wanted to play in the park",
    ],
    "sea": ["Lily and Ben went to the sea", "A small fish lived in a pond"],
}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """A tiny model on a shared 2-core machine: a second intra-op thread only spins."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")  # for the servers launched as processes
        yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target() -> TargetParams:
    return TargetParams(
        path=str(STORIES), chat_template=str(TEMPLATE), device="cpu", dtype="float32"
    )


@pytest.fixture(scope="module")
def tokenizer(target):
    return target_tokenizer(target)


@pytest.fixture(scope="module")
def model():
    return load_causal_lm(str(STORIES), "cpu", "float32")


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, model, tokenizer) -> Path:
    """An exported drafter that always proposes ".": the target agrees now and then, so the
    verify steps are neither one per token nor one per num_steps + 1 tokens."""
    period = tokenizer.convert_tokens_to_ids(".")
    assert period + DRAFT_VOCAB <= model.config.vocab_size
    cfg = Eagle3Config.from_target(model.config, DRAFT_VOCAB, [1, 2, 3])
    drafter = Eagle3Drafter(cfg)
    used = period + torch.arange(DRAFT_VOCAB)  # draft index 0 is "."
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    with torch.no_grad():
        drafter.lm_head.weight.zero_()  # equal logits: index 0 wins
        drafter.set_vocab(used - torch.arange(DRAFT_VOCAB), t2d)
    return export_drafter(
        drafter,
        cfg,
        tmp_path_factory.mktemp("models") / "drafter",
        model.config,
        {"purpose": "test"},
    )


@pytest.fixture(scope="module")
def prompts(target, tokenizer) -> dict[str, list[list[int]]]:
    return {
        name: [
            render_prompt(tokenizer, [{"role": "user", "content": text}], None, {})
            for text in texts
        ]
        for name, texts in OPENINGS.items()
    }


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory, prompts) -> Path:
    """The merge stage's eval split: prompt + reply ids, the reply supervised."""
    rows = [
        {
            "sample_id": f"{name}/{i}",
            "dataset": name,
            "input_ids": ids + [5, 6, 7],
            "loss_spans": [[len(ids), len(ids) + 3]],
            "split": "eval",
        }
        for name, group in prompts.items()
        for i, ids in enumerate(group)
    ]
    path = tmp_path_factory.mktemp("merged") / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def servers(model, tokenizer, drafter_dir):
    """(speculative, plain) servers of the same target, on real local ports."""

    def serve(speculative=None) -> HFServer:
        engine = HFEngine(model, pad_id(tokenizer), batch_size=8)
        return HFServer(
            engine, eos_ids=model_eos_ids(model), model_path=str(STORIES), speculative=speculative
        ).start()

    drafter, _ = load_drafter(drafter_dir)
    spec = serve(Speculative(model, drafter.eval(), NUM_STEPS, str(drafter_dir)))
    plain = serve()
    yield spec, plain
    spec.stop()
    plain.stop()


def run_stage(
    tmp_path: Path, target: TargetParams, eval_file: Path, drafter_dir: Path, **sglang
) -> dict:
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
                "benchmark": {
                    "mode": "sglang",
                    "num_steps": NUM_STEPS,
                    "temperatures": [0.0],
                    "max_new_tokens": MAX_NEW_TOKENS,
                    "sglang": {"concurrency": 2, **sglang},
                },
            }
        )
    )
    benchmark.main(
        eval_file.parent,
        drafter_dir,
        tmp_path / "reports" / "benchmark.json",
        tmp_path / "reports" / "plots" / "benchmark_acceptance.csv",
        params,
    )
    return json.loads((tmp_path / "reports" / "benchmark.json").read_text())


def expected_commands(
    drafter_dir: Path,
    module: str = "sglang.launch_server",
    server_args: tuple[str, ...] = (
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
        "--tp-size",
        "1",
        "--dp-size",
        "1",
        "--kv-cache-dtype",
        "auto",
        "--enable-metrics",
    ),
) -> dict[str, str]:
    base = [sys.executable, "-m", module, "--model-path", str(STORIES), *server_args]
    spec = [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(drafter_dir),
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    return {"spec": shlex.join(base + spec), "base": shlex.join(base)}


@pytest.fixture(scope="module")
def in_process(model, drafter_dir, prompts, target, tokenizer) -> dict:
    """The hf mode's figures on the same prompts, at temperature 0."""
    b = BenchmarkParams(num_steps=NUM_STEPS, temperatures=[0.0], max_new_tokens=MAX_NEW_TOKENS)
    stop_ids = target_roles(target, tokenizer).stop_ids
    speculate = benchmark.eagle3(drafter_dir, NUM_STEPS).load(model)
    return encode(measured.benchmark(model, speculate, prompts, b, stop_ids)[GREEDY])


@pytest.mark.slow
@pytest.mark.shared(STORIES_REL)
def test_the_in_process_benchmark_shows_progress_and_eta(
    model, drafter_dir, prompts, target, tokenizer, capsys
):
    b = BenchmarkParams(num_steps=NUM_STEPS, temperatures=[0.0, 0.7], max_new_tokens=8)
    speculate = benchmark.eagle3(drafter_dir, NUM_STEPS).load(model)
    measured.benchmark(model, speculate, prompts, b, target_roles(target, tokenizer).stop_ids)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[benchmark]")]
    total = 2 * sum(len(g) for g in prompts.values())
    assert lines and lines[-1].startswith(f"[benchmark] {total}/{total} samples"), lines
    assert all("tok/s" in x and "eta" in x for x in lines)


@pytest.mark.shared(STORIES_REL)
@pytest.mark.integration
@pytest.mark.slow
def test_served_tau_is_the_in_process_count_with_the_prefill_token(
    tmp_path, target, eval_file, drafter_dir, servers, in_process, capsys
):
    spec, plain = servers
    report = run_stage(
        tmp_path, target, eval_file, drafter_dir, spec_url=spec.url, base_url=plain.url
    )
    err = capsys.readouterr().err
    total = len(report["temperatures"]) * sum(map(len, OPENINGS.values()))
    for role in ("spec", "base"):  # each server's requests counted as they come back, with an ETA
        done = [x for x in err.splitlines() if x.startswith(f"[benchmark {role}] {total}/{total}")]
        assert done and "tok/s" in done[-1] and "eta" in done[-1], err
    greedy = report["temperatures"]["0.0"]
    for name, group in OPENINGS.items():
        served, local = greedy["datasets"][name], in_process["datasets"][name]
        assert served["prompts"] == local["prompts"] == len(group)
        assert served["verify_steps"] == local["verify_steps"]
        # SGLang counts the prefill's token; the in-process count leaves it out
        assert served["completion_tokens"] == local["tokens"] + len(group)
        assert served["tau_excluding_prefill"] == local["tau"]
        assert served["tau"] == round(served["completion_tokens"] / served["verify_steps"], 4)
        for key in ("conditional", "unconditional"):  # NaN (nothing reached) is null in JSON
            assert served[key] == [None if x != x else x for x in local[key]]
        assert served["outputs_equal_baseline"] == len(group)  # lossless at temperature 0
        assert served["speedup"] == pytest.approx(
            served["spec_tokens_per_s"] / served["base_tokens_per_s"], rel=1e-2
        )
    tokens, verify_steps = (
        sum(d[key] for d in in_process["datasets"].values()) for key in ("tokens", "verify_steps")
    )
    # the drafter is accepted sometimes, not never and not always
    assert tokens / (NUM_STEPS + 1) < verify_steps < tokens
    assert greedy["verify_steps"] == verify_steps
    assert greedy["completion_tokens"] == tokens + sum(map(len, OPENINGS.values()))
    assert greedy["tau_excluding_prefill"] == in_process["tau"]
    assert report["tau_greedy"] == greedy["tau"]

    facts = report["servers"]["spec"]
    assert report["engine_version"] == facts["version"] and facts["version"].startswith(
        "hf_server (transformers "
    )
    assert (
        facts["speculative_algorithm"],
        facts["speculative_num_steps"],
        facts["speculative_num_draft_tokens"],
    ) == ("EAGLE3", 3, 4)
    assert report["servers"]["base"]["speculative_algorithm"] is None
    # attached: the commands reported are those launch mode would run
    commands = expected_commands(drafter_dir)
    assert {role: report["servers"][role]["command"] for role in commands} == commands
    assert not report["servers"]["spec"]["launched"]
    plot = (tmp_path / "reports" / "plots" / "benchmark_acceptance.csv").read_text().splitlines()
    assert len(plot) == 1 + len(OPENINGS) * NUM_STEPS


@pytest.mark.shared(STORIES_REL)
@pytest.mark.integration
@pytest.mark.slow
def test_a_server_without_speculation_is_refused_with_the_reason(
    tmp_path, target, eval_file, drafter_dir, servers, prompts
):
    spec, plain = servers
    with pytest.raises(
        SGLangError,
        match=r"is not running speculative decoding \(its "
        r"/server_info has speculative_algorithm None\)",
    ):
        run_stage(tmp_path, target, eval_file, drafter_dir, spec_url=plain.url, base_url=plain.url)
    with pytest.raises(SGLangError, match="runs speculative decoding .* so it is no baseline"):
        run_stage(tmp_path, target, eval_file, drafter_dir, spec_url=spec.url, base_url=spec.url)
    with pytest.raises(
        StageError,
        match=r"benchmark.sglang.base_url: http://127.0.0.1:\d+/health "
        r"does not answer 200",
    ):
        run_stage(
            tmp_path,
            target,
            eval_file,
            drafter_dir,
            spec_url=spec.url,
            base_url=f"http://127.0.0.1:{free_port()}",
        )
    # a server that does not say what it runs is caught by its replies
    requests = [(f"tales/{i}", ids) for i, ids in enumerate(prompts["tales"])]
    run = measure(client(plain.url), requests, Sampling(max_new_tokens=8, stop_ids=(2,)))
    with pytest.raises(
        SGLangError,
        match=rf"{plain.url} is not running speculative decoding: its "
        rf"reply to sample tales/\d \(\d tokens\) has no "
        rf"meta_info.spec_verify_ct",
    ):
        acceptance(run)


@pytest.mark.shared(STORIES_REL)
@pytest.mark.slow
@pytest.mark.integration
def test_launch_mode_starts_both_servers_in_turn(
    tmp_path, target, eval_file, drafter_dir, in_process
):
    port = free_port()
    launch = {
        "module": "tests.doubles.hf_server",
        "health_timeout_s": 60,
        "server_args": {"port": port, "max_running_requests": 4},
        "log_file": str(tmp_path / "server.log"),
    }
    report = run_stage(tmp_path, target, eval_file, drafter_dir, launch=launch)
    commands = expected_commands(
        drafter_dir,
        "tests.doubles.hf_server",
        (
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tp-size",
            "1",
            "--dp-size",
            "1",
            "--max-running-requests",
            "4",
            "--kv-cache-dtype",
            "auto",
            "--enable-metrics",
        ),
    )
    for role in ("spec", "base"):
        served = report["servers"][role]
        assert (served["command"], served["url"], served["launched"]) == (
            commands[role],
            f"http://127.0.0.1:{port}",
            True,
        )
    assert report["servers"]["spec"]["speculative_draft_model_path"] == str(drafter_dir)
    assert not is_healthy(f"http://127.0.0.1:{port}")  # both stopped
    greedy = report["temperatures"]["0.0"]
    assert greedy["tau_excluding_prefill"] == in_process["tau"]
    assert greedy["outputs_equal_baseline"] == sum(map(len, OPENINGS.values()))


@pytest.mark.shared(STORIES_REL)
@pytest.mark.integration
@pytest.mark.slow
def test_a_request_the_server_refuses_fails_the_measurement(servers):
    spec, _ = servers
    too_long = [("tales/0", [5] * 500)]  # 500 + 40 new tokens: over stories260K's 512
    with pytest.raises(
        SGLangError,
        match=r"sample tales/0 was aborted \(.*HTTP 400: Requested "
        r"token count exceeds",
    ):
        measure(client(spec.url), too_long, Sampling(max_new_tokens=MAX_NEW_TOKENS))


@pytest.mark.parametrize(
    "sglang, message",
    [
        ({}, "mode sglang needs spec_url and base_url"),
        ({"spec_url": "http://s"}, "mode sglang needs spec_url and base_url"),
        (
            {"spec_url": "http://s", "base_url": "http://b", "launch": SGLangLaunchParams()},
            "give either launch or spec_url and base_url, not both",
        ),
        (
            {"launch": SGLangLaunchParams(extra_args=["--speculative-algorithm", "EAGLE"])},
            r"launch.extra_args: drop the --speculative-\* flags",
        ),
    ],
)
@pytest.mark.shared(STORIES_REL)
def test_server_params_are_checked_before_anything_runs(target, drafter_dir, sglang, message):
    b = BenchmarkParams(mode="sglang", sglang=BenchmarkSGLangParams(**sglang))
    with pytest.raises(StageError, match=message):
        family = benchmark.eagle3(drafter_dir, NUM_STEPS)
        measured.served_benchmark({"t": [[1, 2]]}, b, [2], target, family)


def reply(sample_id: str, **meta) -> Reply:
    ids = list(range(meta["completion_tokens"]))
    return Reply(Completion(sample_id, ids, "length", 0.5), meta)


def test_acceptance_pools_sglang_counts_and_histograms():
    run = ServerRun(
        "http://s",
        [
            reply(
                "a",
                completion_tokens=9,
                spec_verify_ct=4,
                spec_correct_drafts_histogram=[1, 2, 1, 0],
            ),
            reply("b", completion_tokens=1),  # stopped at the prefill's token: no verify step
            reply(
                "c",
                completion_tokens=5,
                spec_verify_ct=2,
                spec_correct_drafts_histogram=[0, 1, 0, 1],
            ),
        ],
        wall_s=2.0,
    )
    acc = acceptance(run)
    assert (acc.requests, acc.completion_tokens, acc.verify_steps) == (3, 15, 6)
    assert (acc.tau, acc.tau_excluding_prefill) == (15 / 6, 12 / 6)
    assert acc.histogram == [1, 3, 1, 1]
    # verify steps reaching draft 1, 2, 3: 5, 2, 1 of 6
    assert acc.per_position(3) == ([5 / 6, 2 / 5, 1 / 2], [5 / 6, 2 / 6, 1 / 6])
    assert run.tokens_per_s == 7.5
    older = ServerRun("http://s", [reply("a", completion_tokens=9, spec_verify_ct=4)], 1.0)
    assert acceptance(older).per_position(3) is None  # no histogram: no per-position figures


@pytest.mark.parametrize(
    "facts, message",
    [
        (
            {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3},
            r"serves \{'speculative_algorithm': 'EAGLE'\}.*EAGLE instead of EAGLE3",
        ),
        (
            {
                "speculative_algorithm": "EAGLE3",
                "speculative_num_steps": 5,
                "speculative_num_draft_tokens": 6,
            },
            r"serves \{'speculative_num_steps': 5, 'speculative_num_draft_tokens': 6\}",
        ),
        (
            {"speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 4},
            r"serves \{'speculative_eagle_topk': 4\}",
        ),
    ],
)
def test_a_speculative_server_with_other_settings_is_refused(facts, message):
    with pytest.raises(SGLangError, match=message):
        check_speculative_server(facts, "http://s", Speculation.eagle3("D", 3))
    silent = {"version": "0.5.23"}  # the server does not say: its replies will tell
    check_speculative_server(silent, "http://s", Speculation.eagle3("D", 3))


def test_a_dflash_server_is_checked_at_its_block_size():
    """SGLang's DFLASH forces num_steps and topk to 1 and takes the block size as the number of
    draft tokens: a server of another block size (or EAGLE3) is refused, naming the flags."""
    spec = Speculation.dflash("models/dflash", 8)
    served = {
        "speculative_algorithm": "DFLASH",
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 8,
    }
    check_speculative_server(served, "http://s", spec)
    with pytest.raises(
        SGLangError,
        match=r"serves \{'speculative_num_draft_tokens': 16\}.*"
        r"--speculative-algorithm DFLASH --speculative-draft-model-path DRAFTER "
        r"--speculative-num-draft-tokens 8",
    ):
        check_speculative_server({**served, "speculative_num_draft_tokens": 16}, "http://s", spec)
    with pytest.raises(SGLangError, match=r"'speculative_algorithm': 'EAGLE3'"):
        check_speculative_server({**served, "speculative_algorithm": "EAGLE3"}, "http://s", spec)


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "d"],
            "only EAGLE3 is served here",
        ),
        (["--speculative-algorithm", "EAGLE3"], "needs --speculative-draft-model-path"),
        (["--speculative-draft-model-path", "d"], "needs --speculative-algorithm EAGLE3"),
        (
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "d",
                "--speculative-eagle-topk",
                "4",
            ],
            "only chains (topk 1)",
        ),
        (
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "d",
                "--speculative-num-steps",
                "3",
                "--speculative-num-draft-tokens",
                "8",
            ],
            "a chain of 3 steps verifies 4 tokens",
        ),
    ],
)
def test_hf_server_refuses_speculative_flags_it_would_misrun(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        hf_server.main(["--model-path", str(STORIES), "--port", str(free_port()), *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.shared(STORIES_REL)
@pytest.mark.integration
@pytest.mark.slow
def test_server_facts_read_server_info(servers):
    spec, _ = servers
    facts = server_facts(spec.url)
    assert facts["model_path"] == str(STORIES)
    assert (facts["speculative_algorithm"], facts["speculative_eagle_topk"]) == ("EAGLE3", 1)
    assert server_facts(f"http://127.0.0.1:{free_port()}") == {}  # nothing listening


@pytest.mark.shared(STORIES_REL)
@pytest.mark.integration
@pytest.mark.slow
def test_servers_with_an_api_key_are_measured_and_the_key_is_in_no_report(
    tmp_path, target, eval_file, drafter_dir, servers, monkeypatch
):
    secret, variable = "sk-Bench-s3cret-0123456789", "EAGLE_TEST_BENCH_KEY"
    spec, plain = servers
    monkeypatch.setattr(spec, "api_key", secret)  # as `--api-key`: /server_info lists it too
    monkeypatch.setattr(plain, "api_key", secret)
    monkeypatch.setenv(variable, secret)
    urls = dict(spec_url=spec.url, base_url=plain.url, api_key_env=variable)
    for run in ("right", "wrong"):
        (tmp_path / run).mkdir()
    report = run_stage(tmp_path / "right", target, eval_file, drafter_dir, **urls)
    assert report["servers"]["spec"]["speculative_algorithm"] == "EAGLE3"
    assert report["temperatures"]["0.0"]["verify_steps"] > 0
    monkeypatch.setenv(variable, "sk-not-the-key")
    with pytest.raises(StageError) as err:
        run_stage(tmp_path / "wrong", target, eval_file, drafter_dir, **urls)
    assert str(err.value).startswith("benchmark.sglang.api_key_env: http://127.0.0.1:")
    assert "HTTP 401" in str(err.value) and "sk-not-the-key" not in str(err.value)
    for path in tmp_path.rglob("*"):
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path
