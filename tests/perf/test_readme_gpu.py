"""tests/perf/readme_gpu.py keeps working where no GPU or SGLang is: each command it runs is one
line of the README, filled in only where a user fills it in; the params it writes pass the
project's check; its serving check tells a drafter that speculates from one that does not."""

from __future__ import annotations

import sys

import pytest
import yaml

from stages.params.sections import check_all
from tests.perf import readme_gpu


@pytest.mark.parametrize("name", sorted(readme_gpu.COMMANDS))
def test_each_command_it_runs_is_one_line_of_the_readme(name):
    line = readme_gpu.readme_command(readme_gpu.COMMANDS[name])
    assert line.startswith(readme_gpu.COMMANDS[name])


def test_a_line_the_readme_lost_is_named():
    with pytest.raises(LookupError, match="0 commands start with 'torchrun --nope'"):
        readme_gpu.readme_command("torchrun --nope")


def test_the_commands_are_filled_in_where_a_user_fills_them_in():
    serve = readme_gpu.as_run_here(
        readme_gpu.readme_command(readme_gpu.COMMANDS["serve"]), "data/demo/target", 1
    )
    assert serve[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert serve[serve.index("--model-path") + 1] == "data/demo/target"
    assert serve[serve.index("--speculative-draft-model-path") + 1] == "models/drafter"
    extract = readme_gpu.as_run_here(
        readme_gpu.readme_command(readme_gpu.COMMANDS["extract"]), "t", 2
    )
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


def reply(tokens: int, verify: int) -> dict:
    return {
        "output_ids": list(range(tokens)),
        "meta_info": {"completion_tokens": tokens, "spec_verify_ct": verify},
    }


def test_the_serving_check_tells_speculation_from_none():
    bench = {"tau_greedy": 2.7}
    drafted = readme_gpu.served_figures([reply(30, 12), reply(20, 8)], bench)
    assert drafted["passed"] and drafted["accept_length"] == 2.5
    every_draft_rejected = readme_gpu.served_figures([reply(30, 30)], bench)
    assert not every_draft_rejected["passed"]
    plain_server = readme_gpu.served_figures(
        [{"output_ids": [1], "meta_info": {"completion_tokens": 1}}], bench
    )
    assert not plain_server["passed"] and plain_server["accept_length"] is None
    empty = readme_gpu.served_figures([reply(30, 10), reply(0, 0)], bench)
    assert not empty["passed"] and empty["answered"] == 1
