"""Bad input fails through the stage entry points with one clear line (exit code 1) and writes
nothing outside the data folders: dataset names that are paths, sample ids that look like paths,
layers outside the target, a draft vocabulary larger than the target's, a target without a
tokenizer or chat template, an exported drafter with a missing or extra key, a benchmark prompt
file in another format, a params file that is not YAML."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest
import yaml
from safetensors.torch import load_file, save_file

from stages import benchmark, extract, generate, merge, prep, quality, vocab
from tests.conftest import DEMO_TARGET
from tests.reliability import demo_params, export_demo_drafter, source, tree
from tests.runtime.test_distributed import write_merged
from tests.stage_runner import run_stage


def prep_args(tmp, name="d"):
    return [
        name,
        "--params",
        tmp / "params.yaml",
        "--out",
        tmp / "data/prompts/d.parquet",
        "--report",
        tmp / "reports/prep/d.json",
    ]


@pytest.mark.parametrize("name", ["a/b", "../escape", "..", "x\x00y", ".hidden", "../../etc/x"])
def test_a_dataset_name_that_is_a_path_is_refused_by_every_stage(
    tmp_path, monkeypatch, capsys, name
):
    params = demo_params(tmp_path)
    raw = yaml.safe_load(params.read_text())
    raw["datasets"] = {name: raw["datasets"]["d"]}
    params.write_text(yaml.safe_dump(raw))
    before = tree(tmp_path.parent)
    runs = [
        (prep.main, prep_args(tmp_path, name)),
        (
            generate.main,
            [
                name,
                "--params",
                params,
                "--prompts",
                tmp_path / "p.parquet",
                "--out",
                tmp_path / "data/raw/bad",
                "--report",
                tmp_path / "r.json",
            ],
        ),
        (
            merge.main,
            [
                "--params",
                params,
                "--raw",
                tmp_path / "data/raw",
                "--out",
                tmp_path / "data/merged",
                "--report",
                tmp_path / "m.json",
            ],
        ),
        (
            quality.main,
            [
                "--params",
                params,
                "--raw-dir",
                tmp_path / "data/raw",
                "--prep-dir",
                tmp_path,
                "--report",
                tmp_path / "q.json",
                "--summary",
                tmp_path / "q.md",
                "--plot",
                tmp_path / "q.csv",
            ],
        ),
    ]
    for main, args in runs:
        code, _, err = run_stage(main, args, monkeypatch, capsys)
        assert code == 1, err
        assert f"dataset name {name!r} cannot name files and stages" in err, err
    assert tree(tmp_path.parent) == before  # nothing written, here or above


def test_sample_ids_that_look_like_paths_stay_data(tmp_path, monkeypatch, capsys):
    """Source ids with /, .. and NUL go through prep, generate and merge as plain strings: no
    file is named after a sample, none lands outside the output folders."""
    ids = ["../../outside", "a/b/c", "nul\x00id", "/abs/path", "..", "plain"]
    source(tmp_path, ids)
    params = demo_params(tmp_path)
    code, _, err = run_stage(prep.main, prep_args(tmp_path), monkeypatch, capsys)
    assert code == 0, err
    code, _, err = run_stage(
        generate.main,
        [
            "d",
            "--params",
            params,
            "--prompts",
            tmp_path / "data/prompts/d.parquet",
            "--out",
            tmp_path / "data/raw/d",
            "--report",
            tmp_path / "reports/generate/d.json",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    code, _, err = run_stage(
        merge.main,
        [
            "--params",
            params,
            "--raw",
            tmp_path / "data/raw",
            "--out",
            tmp_path / "data/merged",
            "--report",
            tmp_path / "reports/merge.json",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    merged = [
        r["sample_id"]
        for split in ("train", "eval")
        for r in pq.read_table(tmp_path / f"data/merged/{split}.parquet").to_pylist()
    ]
    assert sorted(merged) == sorted(f"d/{i}" for i in ids)
    assert tree(tmp_path) == [
        "data/",
        "data/merged/",
        "data/merged/eval.parquet",
        "data/merged/train.parquet",
        "data/prompts/",
        "data/prompts/d.parquet",
        "data/raw/",
        "data/raw/d/",
        "data/raw/d/part-00003.parquet",
        "data/raw/d/part-00003.parquet.sha256.json",
        "params.yaml",
        "reports/",
        "reports/generate/",
        "reports/generate/d.json",
        "reports/merge.json",
        "reports/prep/",
        "reports/prep/d.json",
        "source.json",
    ]


def test_layers_outside_the_target_are_refused(tmp_path, monkeypatch, capsys):
    write_merged(tmp_path / "merged", n_train=2, n_eval=1)
    for layers, needle in (([2, 4, 8], "8"), ([-1, 2, 3], "-1")):
        params = demo_params(tmp_path, extract={"layers": layers})
        code, _, err = run_stage(
            extract.main,
            [
                "--params",
                params,
                "--merged",
                tmp_path / "merged",
                "--out",
                tmp_path / "hidden",
                "--report",
                tmp_path / "extract.json",
            ],
            monkeypatch,
            capsys,
        )
        assert code == 1, err
        expected = (
            f"error: extract.layers: HF hidden-state indices [{needle}] are outside 0..7 for a "
            f"8-layer target"
        )
        assert expected in err, err
        assert not (tmp_path / "hidden").exists() and not (tmp_path / "extract.json").exists()


def test_a_draft_vocabulary_larger_than_the_targets_is_refused(tmp_path, monkeypatch, capsys):
    write_merged(tmp_path / "merged", n_train=2, n_eval=1)
    params = demo_params(tmp_path, vocab={"draft_vocab_size": 4096})
    code, _, err = run_stage(
        vocab.main,
        [
            "--params",
            params,
            "--merged",
            tmp_path / "merged",
            "--out",
            tmp_path / "vocab/d2t_t2d.safetensors",
            "--report",
            tmp_path / "vocab.json",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 1
    assert "vocab.draft_vocab_size: 4096 is larger than the target vocabulary (2048)" in err, err
    assert not (tmp_path / "vocab").exists()


def test_a_target_without_a_tokenizer_is_named(tmp_path, monkeypatch, capsys):
    bare = tmp_path / "bare-target"
    bare.mkdir()
    shutil.copy(DEMO_TARGET / "config.json", bare)
    source(tmp_path, ["x"])
    demo_params(tmp_path, target={"path": str(bare)})
    code, _, err = run_stage(prep.main, prep_args(tmp_path), monkeypatch, capsys)
    assert code == 1, err
    assert f"error: target: {bare}: no tokenizer (no tokenizer.json" in err, err
    assert len(err.strip().splitlines()) == 1
    empty = tmp_path / "empty-target"
    empty.mkdir()
    demo_params(tmp_path, target={"path": str(empty)})
    code, _, err = run_stage(prep.main, prep_args(tmp_path), monkeypatch, capsys)
    assert code == 1 and f"target: {empty} holds no model or tokenizer" in err, err


def test_a_target_without_a_chat_template_is_named(tmp_path, monkeypatch, capsys):
    plain = tmp_path / "no-template"
    shutil.copytree(DEMO_TARGET, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in plain.glob("chat_template*"):
        extra.unlink()
    source(tmp_path, ["x"])
    demo_params(tmp_path, target={"path": str(plain)})
    code, _, err = run_stage(prep.main, prep_args(tmp_path), monkeypatch, capsys)
    assert code == 1, err
    assert "target: the tokenizer at" in err and "has no chat template" in err, err
    demo_params(tmp_path, target={"path": str(plain), "chat_template": str(tmp_path / "no.jinja")})
    code, _, err = run_stage(prep.main, prep_args(tmp_path), monkeypatch, capsys)
    assert code == 1, err
    assert f"target: chat template file {tmp_path / 'no.jinja'} does not exist" in err, err
    assert not (tmp_path / "data").exists()


@pytest.fixture(scope="module")
def benchmark_inputs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    write_merged(tmp / "merged", n_train=2, n_eval=2)
    export_demo_drafter(tmp / "models" / "drafter")
    return tmp


def run_benchmark(tmp, drafter, params, monkeypatch, capsys):
    return run_stage(
        benchmark.main,
        [
            "--params",
            params,
            "--merged",
            tmp / "merged",
            "--drafter-dir",
            drafter,
            "--report",
            tmp / "reports/benchmark.json",
            "--plot",
            tmp / "reports/plots/benchmark_acceptance.csv",
        ],
        monkeypatch,
        capsys,
    )


@pytest.mark.parametrize(
    "change, needle",
    [
        ("drop", "model.safetensors: missing keys ['midlayer.mlp.up_proj.weight']"),
        ("extra", "model.safetensors: unexpected keys ['extra.weight']"),
    ],
)
def test_an_exported_drafter_with_a_missing_or_extra_key_is_refused(
    tmp_path, benchmark_inputs, monkeypatch, capsys, change, needle
):
    drafter = tmp_path / "drafter"
    shutil.copytree(benchmark_inputs / "models" / "drafter", drafter)
    weights = load_file(str(drafter / "model.safetensors"))
    if change == "drop":
        del weights["midlayer.mlp.up_proj.weight"]
    else:
        weights["extra.weight"] = weights["norm.weight"].clone()
    save_file(weights, str(drafter / "model.safetensors"))
    params = demo_params(tmp_path, benchmark={"max_new_tokens": 4, "temperatures": [0.0]})
    code, _, err = run_benchmark(benchmark_inputs, drafter, params, monkeypatch, capsys)
    assert code == 1, err
    assert f"error: {drafter} would load wrongly in the serving engines" in err and needle in err
    assert not (benchmark_inputs / "reports").exists()


@pytest.mark.parametrize(
    "fmt, content, needle",
    [
        ("mt_bench", "sharegpt", "benchmark.datasets.extra: "),
        ("sharegpt", "not json at all {", "benchmark.datasets.extra: "),
        ("gsm8k", "[]", "benchmark.datasets.extra: "),
    ],
)
def test_a_benchmark_prompt_file_in_another_format_is_named(
    tmp_path, benchmark_inputs, monkeypatch, capsys, fmt, content, needle
):
    prompts = tmp_path / "extra.json"
    if content == "sharegpt":
        source(tmp_path, ["a", "b"], "extra.json")  # a ShareGPT file
    else:
        prompts.write_text(content)
    params = demo_params(
        tmp_path,
        benchmark={
            "max_new_tokens": 4,
            "temperatures": [0.0],
            "datasets": {"extra": {"format": fmt, "path": str(prompts)}},
        },
    )
    drafter = benchmark_inputs / "models" / "drafter"
    code, _, err = run_benchmark(benchmark_inputs, drafter, params, monkeypatch, capsys)
    assert code == 1, err
    assert err.startswith(f"error: {needle}") and str(prompts) in err, err
    assert not (benchmark_inputs / "reports").exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        (b"target: [unclosed\ndatasets: {}\n", "not valid YAML at line 2, column 9"),
        (b"target:\n  path: x\n\tdatasets: 1\n", "not valid YAML at line 3"),
        (b"a: \x00\n", "not valid YAML (unacceptable character #x0000"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a YAML text file (not UTF-8 at byte 0)"),
        (b"- a list\n- not a mapping\n", "expected a mapping at the top level"),
    ],
)
def test_a_params_file_that_is_not_yaml_is_named(tmp_path, monkeypatch, capsys, text, needle):
    params = tmp_path / "params.yaml"
    params.write_bytes(text)
    for main, args in [
        (prep.main, prep_args(tmp_path)),
        (
            merge.main,
            [
                "--params",
                params,
                "--raw",
                tmp_path / "raw",
                "--out",
                tmp_path / "m",
                "--report",
                tmp_path / "m.json",
            ],
        ),
        (
            vocab.main,
            [
                "--params",
                params,
                "--merged",
                tmp_path / "m",
                "--out",
                tmp_path / "v.safetensors",
                "--report",
                tmp_path / "v.json",
            ],
        ),
    ]:
        code, _, err = run_stage(main, args, monkeypatch, capsys)
        assert code == 1, err
        assert err.startswith(f"error: {params}: {needle}"), err
        assert len(err.strip().splitlines()) == 1
    assert tree(tmp_path) == ["params.yaml"]
