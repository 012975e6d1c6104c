"""tests/perf/readme_gpu.py keeps working where no GPU or SGLang is: each command it runs is one
line of the README, filled in only where a user fills it in; the params it writes pass the
project's check; its serving check tells a drafter that speculates from one that does not."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from stages.engines import Completion
from stages.engines.sglang_http import Reply, SGLangError
from stages.params.sections import check_all
from stages.serving.bench import ServerRun
from tests.engines.conftest import free_port
from tests.perf import readme_gpu
from tests.project import ROOT
from tests.readme_text import as_run_here, readme_command


@pytest.mark.parametrize("name", sorted(readme_gpu.COMMANDS))
def test_each_command_it_runs_is_one_line_of_the_readme(name):
    line = readme_command(readme_gpu.COMMANDS[name])
    assert line.startswith(readme_gpu.COMMANDS[name])


def test_a_line_the_readme_lost_is_named():
    with pytest.raises(LookupError, match="0 commands start with 'torchrun --nope'"):
        readme_command("torchrun --nope")


def test_the_commands_are_filled_in_where_a_user_fills_them_in():
    serve = as_run_here(readme_command(readme_gpu.COMMANDS["serve"]), "data/demo/target", 1)
    assert serve[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert serve[serve.index("--model-path") + 1] == "data/demo/target"
    assert serve[serve.index("--speculative-draft-model-path") + 1] == "models/drafter"
    extract = as_run_here(readme_command(readme_gpu.COMMANDS["extract"]), "t", 2)
    assert extract[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert extract[extract.index("--nproc-per-node") + 1] == "2"
    assert extract[-6:] == ["--merged", "data/merged", "--out", "data/hidden", "--report"] + [
        "reports/extract.json"
    ]


def test_the_copy_it_runs_in_has_params_pointed_at_the_gpus(tmp_path):
    copy = readme_gpu.workspace(tmp_path, 2)
    assert (copy / "stages" / "train.py").exists() and not (copy / ".git").exists()
    assert not (copy / "data" / "hidden").exists() and not (copy / ".venv").exists()
    check_all(copy / "params.yaml")
    p = yaml.safe_load((copy / "params.yaml").read_text())
    assert p["extract"]["engine"] == "sglang" and p["extract"]["sglang"]["tp_size"] == 2
    assert p["target"]["device"] == "cuda" and p["train"]["max_steps"] == readme_gpu.TRAIN_STEPS
    assert readme_gpu.workspace(tmp_path, 2) == copy, "made once per work folder"


def reply(tokens: int, verify: int | None) -> Reply:
    meta = {"completion_tokens": tokens}
    if verify is not None:
        meta["spec_verify_ct"] = verify
    return Reply(Completion("s", list(range(tokens)), "stop", 0.1), meta)


def figures(*replies: Reply) -> dict:
    run = ServerRun("http://127.0.0.1:30000", list(replies), 1.0)
    return readme_gpu.served_figures(run, {"tau_greedy": 2.7})


def test_the_serving_check_tells_speculation_from_none():
    drafted = figures(reply(30, 12), reply(20, 8))
    assert drafted["passed"] and drafted["accept_length"] == 2.5
    assert drafted["without_prefill"] == 2.4 and drafted["demo_tau_in_process"] == 2.7
    assert not figures(reply(30, 30))["passed"], "every draft rejected"
    with pytest.raises(SGLangError, match="is not running speculative decoding"):
        figures(reply(30, 12), reply(5, None))
    empty = figures(reply(30, 10), reply(0, 0))
    assert not empty["passed"] and empty["answered"] == 1


@pytest.mark.slow
def test_the_readmes_serving_line_runs_on_the_cpu_stand_in(tmp_path):
    """The serve path end to end, the README's line served by the CPU stand-in (which drafts
    with the exported drafter as SGLang does) over a finished demo run."""
    if not (ROOT / "models" / "drafter" / "config.json").exists():
        pytest.skip("no finished demo run here (models/drafter/config.json); `make demo` first")
    out = tmp_path / "readme-gpu.json"
    argv = ["--work", str(tmp_path), "--paths", "serve", "--json-out", str(out)]
    argv += ["--server-module", "tests.doubles.hf_server"]
    argv += [f"--extra-server-args=--port {free_port()} --device cpu"]
    assert readme_gpu.main(argv) == 0
    served = json.loads(out.read_text())["paths"]["serve"]
    assert served["answered"] == served["replies"] > 0 and served["accept_length"] > 1.0
