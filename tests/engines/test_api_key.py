"""Servers that need an API key (SGLang's --api-key): params name the environment variable that
holds it (`generate.sglang.api_key_env`, `benchmark.sglang.api_key_env`), every client sends
`Authorization: Bearer <key>`, a missing variable fails naming it, a refused key fails naming the
params key, and the key appears in no output file, no printed line and no exception."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import httpx
import pytest
import yaml

from stages import generate
from stages.artifacts.raw import read_raw
from stages.capture.served import served_aux
from stages.engines import AuthError
from stages.params.benchmark import BenchmarkParams
from stages.params.extract import ExtractParams
from stages.params.generate import GenerateParams
from stages.runtime.errors import ParamsError
from stages.serving.bench import server_facts
from stages.serving.monitor import ServerMetrics
from stages.wiring.target import api_key
from tests.stage_runner import run_stage

SECRET = "sk-Sup3r-s3cret-Key-0123456789abcdef"
WRONG = "sk-Wr0ng-Key-fedcba9876543210"
VAR = "EAGLE_TEST_SGLANG_KEY"


def write_params(tmp_path: Path, target, url: str, key_env: str | None) -> Path:
    params = {
        "target": {
            "path": target.path,
            "chat_template": target.chat_template,
            "device": "cpu",
            "dtype": "float32",
        },
        "datasets": {"t": {"prep": {"format": "sharegpt", "path": "unused"}}},
        "generate": {
            "engine": "sglang",
            "max_new_tokens": 8,
            "append_every": 4,
            "sglang": {
                "urls": [url],
                "concurrency": 4,
                "max_retries": 1,
                "backoff_s": 0.001,
                "backoff_max_s": 0.01,
                "api_key_env": key_env,
            },
        },
    }
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def run_generate(tmp_path, params, prompts_file, monkeypatch, capsys, run: str):
    return run_stage(
        generate.main,
        [
            "t",
            "--params",
            params,
            "--prompts",
            prompts_file,
            "--out",
            tmp_path / run / "raw" / "t",
            "--report",
            tmp_path / run / "reports" / "t.json",
        ],
        monkeypatch,
        capsys,
    )


def assert_nowhere(secrets: tuple[str, ...], root: Path, *texts: str) -> None:
    """No file under `root` (raw parts, checksums, reports, params) and no text holds a secret."""
    files = [p for p in root.rglob("*") if p.is_file()]
    assert files
    for secret in secrets:
        for path in files:
            assert secret.encode() not in path.read_bytes(), path
        for text in texts:
            assert secret not in text


@pytest.mark.slow
@pytest.mark.integration
def test_generate_sends_the_key_and_never_writes_it(
    tmp_path, serve, target, prompts_file, monkeypatch, capsys
):
    server = serve(api_key=SECRET)
    params = write_params(tmp_path, target, server.url, VAR)

    # the right key: every request carries it, the stage completes
    monkeypatch.setenv(VAR, SECRET)
    code, out, err = run_generate(tmp_path, params, prompts_file, monkeypatch, capsys, "right")
    assert code == 0, err
    report = json.loads((tmp_path / "right" / "reports" / "t.json").read_text())
    assert report["samples"] == report["prompts"] == 12 and report["failed"] == 0
    assert server.stats["unauthorized"] == 0 and server.stats["completed"] == 12
    logs = [out, err]

    # a wrong key: the first reply's 401 ends the run, naming the params key, storing no abort
    monkeypatch.setenv(VAR, WRONG)
    code, out, err = run_generate(tmp_path, params, prompts_file, monkeypatch, capsys, "wrong")
    assert code == 1
    assert "error: generate.sglang.api_key_env:" in err and "HTTP 401" in err, err
    assert "refused the API key sent" in err
    assert read_raw(tmp_path / "wrong" / "raw" / "t").num_rows == 0
    assert server.stats["unauthorized"] >= 1
    logs += [out, err]

    # no key although the server wants one
    (tmp_path / "nokey").mkdir()
    no_key = write_params(tmp_path / "nokey", target, server.url, None)
    code, out, err = run_generate(tmp_path, no_key, prompts_file, monkeypatch, capsys, "none")
    assert code == 1 and "no API key was sent" in err, err
    logs += [out, err]

    # the variable unset: named, before any request
    monkeypatch.delenv(VAR)
    code, out, err = run_generate(tmp_path, params, prompts_file, monkeypatch, capsys, "unset")
    assert code == 1
    assert f"generate.sglang.api_key_env: the environment variable {VAR} is not set" in err
    logs += [out, err]

    assert_nowhere((SECRET, WRONG), tmp_path, *logs)


@pytest.mark.integration
def test_engine_errors_hold_no_key(serve, prompts, stop_ids):
    from stages.engines import Sampling
    from tests.engines.conftest import client

    server = serve(api_key=SECRET)
    engine = client(server.url, api_key=WRONG)
    with pytest.raises(AuthError) as caught:
        list(engine.generate(prompts[:2], Sampling(max_new_tokens=4, stop_ids=stop_ids)))
    text = "".join(traceback.format_exception(caught.value)) + repr(engine)
    assert "HTTP 401" in text and "refused the API key sent" in text
    assert WRONG not in text and SECRET not in text


@pytest.mark.integration
def test_benchmark_monitor_and_canary_clients_send_the_key(serve, prompts):
    server = serve(api_key=SECRET)
    # /server_info: the speculative settings are read with the key; SGLang's answer also holds
    # the server's --api-key, which is never kept
    facts = server_facts(server.url, api_key=SECRET)
    assert facts["model_path"] == "" and "api_key" not in facts
    assert SECRET not in json.dumps(facts)
    for key in (None, WRONG):
        with pytest.raises(AuthError) as err:
            server_facts(server.url, api_key=key)
        assert "HTTP 401" in str(err.value) and WRONG not in str(err.value)
    # /health and /metrics are open, as SGLang's middleware leaves them
    assert httpx.get(f"{server.url}/health", trust_env=False).status_code == 200
    assert ServerMetrics([server.url], api_key=SECRET).summary() is not None
    assert ServerMetrics([server.url]).summary() is not None
    # the canary's /generate with return_hidden_states: refused without the key
    with pytest.raises(AuthError) as err:
        served_aux(server.url, prompts[0][1], 8, api_key=WRONG)
    assert "refused the API key sent" in str(err.value) and WRONG not in str(err.value)
    unauthorized = server.stats["unauthorized"]
    with httpx.Client(trust_env=False) as http:
        assert http.get(f"{server.url}/server_info").status_code == 401
        good = http.get(f"{server.url}/server_info", headers={"Authorization": f"Bearer {SECRET}"})
        assert good.status_code == 200
    assert server.stats["unauthorized"] == unauthorized + 1


def test_a_missing_variable_is_named(monkeypatch):
    monkeypatch.delenv(VAR, raising=False)
    assert api_key(None, "generate.sglang.api_key_env") is None
    with pytest.raises(Exception, match=f"{VAR} is not set") as err:
        api_key(VAR, "benchmark.sglang.api_key_env")
    assert str(err.value).startswith("benchmark.sglang.api_key_env:")
    monkeypatch.setenv(VAR, f"  {SECRET}\n")
    assert api_key(VAR, "generate.sglang.api_key_env") == SECRET


@pytest.mark.parametrize(
    "section, cls, value",
    [
        ("generate", GenerateParams, SECRET),
        ("generate", GenerateParams, "abcdef0123456789abcdef0123456789"),
        ("benchmark", BenchmarkParams, SECRET),
        ("benchmark", BenchmarkParams, 1234567890123),
    ],
)
def test_a_key_in_params_is_refused_and_not_repeated(tmp_path, section, cls, value):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({section: {"sglang": {"api_key_env": value}}}))
    with pytest.raises(ParamsError) as err:
        cls.read(path)
    message = str(err.value)
    assert f"{section}.sglang.api_key_env" in message and str(value) not in message
    assert "not shown" in message


def test_key_names_are_accepted(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "generate": {"sglang": {"api_key_env": "SGLANG_API_KEY"}},
                "benchmark": {"sglang": {"api_key_env": "BENCH_KEY_2"}},
                "extract": {"canary": {"api_key_env": "CANARY_KEY"}},
            }
        )
    )
    assert GenerateParams.read(path).sglang.api_key_env == ("SGLANG_API_KEY")
    assert BenchmarkParams.read(path).sglang.api_key_env == ("BENCH_KEY_2")
    assert ExtractParams.read(path).canary.api_key_env == "CANARY_KEY"


def test_hf_server_takes_api_key_as_sglang_does():
    from tests.doubles.hf_server import HFServer

    server = HFServer(api_key=SECRET)
    try:
        assert server.authorized("/health", None) and server.authorized("/metrics", None)
        assert not server.authorized("/generate", None)
        assert not server.authorized("/generate", f"Bearer {WRONG}")
        assert server.authorized("/generate", f"Bearer {SECRET}")
        assert HFServer().authorized("/generate", None)
    finally:
        server.stop()
