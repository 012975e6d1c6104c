"""The benchmark_dflash stage on CPU at tiny sizes: a randomly initialised DFlash drafter of the
demo target, exported as the training stage exports one, measured on the EAGLE-3 benchmark's
prompts and temperatures; at T = 0 its outputs are plain greedy decoding's, tau lies in
[1, block_size], and both reports state the tokens each verifies per step."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from stages import benchmark, benchmark_dflash
from stages.cli import StageError
from stages.dflash.export import export_dflash
from stages.dflash.model import DFlashConfig, DFlashDrafter
from stages.params.benchmark import BenchmarkParams, BenchmarkSGLangParams
from stages.params.server import SGLangLaunchParams
from stages.params.target import TargetParams
from stages.reports.benchmark import (
    DFLASH_RECORDS,
    DFlashInProcessBenchmark,
    NotTrained,
    read_benchmark,
    read_dflash_benchmark,
)
from stages.wiring.benchmark import launch_commands, served_benchmark
from tests.conftest import DEMO_TARGET
from tests.reliability import demo_params, export_demo_drafter
from tests.runtime.test_distributed import write_merged
from tests.stage_runner import run_stage

BLOCK = 5  # the DFlash drafter's; EAGLE-3's chain of 3 verifies 4 tokens per step
MASK_ID = 14  # the demo tokenizer's [PAD]: never generated
BENCH = {"max_new_tokens": 12, "max_prompts": 2, "temperatures": [0.0, 0.7], "num_steps": 3}


def export_random_dflash(out, block_size: int = BLOCK):
    target_config = AutoConfig.from_pretrained(DEMO_TARGET, local_files_only=True)
    cfg = DFlashConfig.from_target(
        target_config, num_hidden_layers=1, block_size=block_size, mask_token_id=MASK_ID
    )
    torch.manual_seed(0)
    return export_dflash(DFlashDrafter(cfg), out, target_config)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_dflash")
    write_merged(tmp / "merged", n_train=2, n_eval=3)
    export_random_dflash(tmp / "models" / "dflash")
    export_demo_drafter(tmp / "models" / "drafter")
    return tmp


def stage_args(tmp, drafter_dir, name: str) -> list:
    """The stage's command line, as dvc.yaml gives it, with its params under `tmp`."""
    params = demo_params(tmp, benchmark=BENCH)
    return [
        "--params",
        params,
        "--merged",
        tmp / "merged",
        "--drafter-dir",
        drafter_dir,
        "--report",
        tmp / f"reports/{name}.json",
        "--plot",
        tmp / f"reports/plots/{name}_acceptance.csv",
    ]


@pytest.fixture(scope="module")
def reports(inputs):
    """Both families' stages on the same params: (EAGLE-3's report, DFlash's)."""
    for stage, name, drafter in (
        (benchmark, "benchmark", "drafter"),
        (benchmark_dflash, "benchmark_dflash", "dflash"),
    ):
        args = stage_args(inputs, inputs / "models" / drafter, name)
        stage.main(*args[3::2], params=args[1])
    return (
        read_benchmark(inputs / "reports/benchmark.json"),
        read_benchmark(inputs / "reports/benchmark_dflash.json", DFLASH_RECORDS),
    )


def test_greedy_outputs_are_plain_decodings_and_tau_is_within_the_block(reports):
    _, dflash = reports
    assert isinstance(dflash, DFlashInProcessBenchmark)
    assert (dflash.drafter, dflash.mode, dflash.num_steps) == ("DFlash", "block", BLOCK - 1)
    assert dflash.tokens_verified_per_step == BLOCK  # the exported drafter's block size
    greedy = dflash.temperatures[0.0]
    assert greedy.outputs_equal_baseline == greedy.prompts > 0
    for t in BENCH["temperatures"]:
        figures = dflash.temperatures[t]
        assert figures.tau is not None and 1.0 <= figures.tau <= BLOCK, (t, figures.tau)
        assert len(figures.conditional or []) == BLOCK - 1 and figures.verify_steps > 0
    assert "--speculative-algorithm DFLASH" in dflash.sglang_launch
    assert f"--speculative-num-draft-tokens {BLOCK}" in dflash.sglang_launch
    assert "--speculative-num-steps" not in dflash.sglang_launch


def test_both_families_measure_the_same_prompts_and_state_their_width(reports, inputs):
    eagle3, dflash = reports
    assert (eagle3.drafter, eagle3.tokens_verified_per_step) == ("EAGLE-3", BENCH["num_steps"] + 1)
    assert list(eagle3.temperatures) == list(dflash.temperatures) == BENCH["temperatures"]
    for t in BENCH["temperatures"]:
        prompts = {d: v.prompts for d, v in eagle3.temperatures[t].datasets.items()}
        assert prompts == {d: v.prompts for d, v in dflash.temperatures[t].datasets.items()}
    written = json.loads((inputs / "reports/benchmark_dflash.json").read_text())
    assert written["tokens_verified_per_step"] == BLOCK
    with open(inputs / "reports/plots/benchmark_dflash_acceptance.csv") as f:
        positions = {int(r["position"]) for r in csv.DictReader(f)}
    assert positions == set(range(1, BLOCK))


def test_a_damaged_dflash_export_is_refused_naming_the_key(tmp_path, inputs, monkeypatch, capsys):
    drafter = tmp_path / "dflash"
    shutil.copytree(inputs / "models" / "dflash", drafter)
    weights = load_file(str(drafter / "model.safetensors"))
    del weights["fc.weight"]
    save_file(weights, str(drafter / "model.safetensors"))
    args = stage_args(tmp_path, drafter, "benchmark_dflash")
    args[3] = inputs / "merged"  # the prompts the module measured
    code, _, err = run_stage(benchmark_dflash.main, args, monkeypatch, capsys)
    assert code == 1
    assert f"{drafter} would load wrongly in SGLang's DFLASH worker" in err
    assert "missing keys ['fc.weight']" in err
    assert not (tmp_path / "reports").exists()


def test_an_empty_drafter_dir_is_reported_as_not_trained(
    tmp_path, reports, inputs, monkeypatch, capsys
):
    """extract.drafters leaves out dflash: train_dflash leaves models/dflash empty, and the stage
    loads nothing, writes a report saying why and the plot's header alone, and succeeds."""
    drafter = tmp_path / "models" / "dflash"
    drafter.mkdir(parents=True)
    args = stage_args(tmp_path, drafter, "benchmark_dflash")
    code, out, _ = run_stage(benchmark_dflash.main, args, monkeypatch, capsys)
    assert code == 0
    reason = f"extract.drafters leaves out dflash, so train_dflash left {drafter} empty"
    assert f"DFlash not trained: {reason}" in out
    written = read_dflash_benchmark(tmp_path / "reports/benchmark_dflash.json")
    assert written == NotTrained(drafter="DFlash", trained=False, reason=reason)
    plot = (tmp_path / "reports/plots/benchmark_dflash_acceptance.csv").read_text()
    measured = (inputs / "reports/plots/benchmark_dflash_acceptance.csv").read_text()
    assert plot == measured.splitlines(keepends=True)[0]  # the measured plot's header, no row
    assert plot == "temperature,dataset,position,conditional,unconditional\n"


@pytest.mark.parametrize(
    "damage, message",
    [
        ("config.json", "missing config.json"),  # weights without their config: no empty dir
        ("dflash_config", "would load wrongly in SGLang's DFLASH worker"),
    ],
)
def test_a_drafter_dir_without_a_sound_config_still_fails(
    tmp_path, inputs, monkeypatch, capsys, damage, message
):
    """Only an empty directory means "not trained": a config missing or broken is a fault."""
    drafter = tmp_path / "dflash"
    shutil.copytree(inputs / "models" / "dflash", drafter)
    config = drafter / "config.json"
    if damage == "config.json":
        config.unlink()
    else:
        config.write_text(json.dumps({**json.loads(config.read_text()), damage: None}))
    args = stage_args(tmp_path, drafter, "benchmark_dflash")
    args[3] = inputs / "merged"
    code, _, err = run_stage(benchmark_dflash.main, args, monkeypatch, capsys)
    assert code == 1
    assert f"{drafter}" in err and message in err
    assert not (tmp_path / "reports").exists()


def test_the_served_benchmark_launches_the_dflash_server_at_the_drafters_block(inputs):
    """Mode sglang: the speculative server is the base one plus the DFLASH flags, its block
    size the exported drafter's (SGLang takes it as --speculative-num-draft-tokens)."""
    family = benchmark_dflash.dflash(inputs / "models" / "dflash", BLOCK)
    target = TargetParams(path=str(DEMO_TARGET))
    commands = launch_commands(SGLangLaunchParams(), target, family.speculation)
    added = commands["spec"][len(commands["base"]) :]
    assert commands["spec"][: len(commands["base"])] == commands["base"]
    assert added == [
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        str(inputs / "models" / "dflash"),
        "--speculative-num-draft-tokens",
        str(BLOCK),
    ]


@pytest.mark.parametrize(
    "sglang, message",
    [
        (
            {"spec_url": "http://127.0.0.1:9", "base_url": "http://127.0.0.1:9"},
            "mode sglang needs dflash_url and base_url",
        ),
        (
            {"dflash_url": "http://127.0.0.1:9", "base_url": "http://127.0.0.1:9"},
            r"benchmark.sglang.dflash_url: http://127.0.0.1:9/health does not answer 200",
        ),
    ],
)
def test_the_dflash_server_is_the_one_dflash_url_names(inputs, sglang, message):
    """EAGLE-3's server (spec_url) is no DFlash server: the DFlash benchmark attaches to its
    own, and names that key when it is missing or does not answer."""
    b = BenchmarkParams(mode="sglang", sglang=BenchmarkSGLangParams(**sglang))
    family = benchmark_dflash.dflash(inputs / "models" / "dflash", BLOCK)
    with pytest.raises(StageError, match=message):
        served_benchmark({"d": [[1, 2]]}, b, [2], TargetParams(path=str(DEMO_TARGET)), family)
