import pytest

from stages.params.datasets import read_dataset, read_datasets
from stages.params.generate import GenerateParams
from stages.params.merge import MergeParams
from stages.params.quality import QualityParams
from stages.params.schema import load_params
from stages.params.target import TargetParams
from stages.params.train import TrainParams
from stages.runtime.errors import ParamsError


def write(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


def test_section_builds_typed_values_and_defaults(tmp_path):
    p = write(tmp_path, "merge: {seed: 3, eval_fraction: 1}\n")
    m = MergeParams.read(p)
    assert (m.seed, m.eval_fraction, m.max_length) == (3, 1.0, 4096)
    assert isinstance(m.eval_fraction, float)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("merge: {sed: 3}\n", "merge.sed: unknown key; did you mean 'seed'?"),
        ("merge: {seed: three}\n", "merge.seed: expected int, got str 'three'"),
        ("merge: {seed: true}\n", "merge.seed: expected int, got bool"),
        ("generate: {engine: vllm}\n", "generate.engine: 'vllm' is not one of ['hf', 'sglang']"),
        ("merge: [1, 2]\n", "merge: expected a mapping"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, needle):
    p = write(tmp_path, text)
    cls = GenerateParams if "generate" in text else MergeParams
    with pytest.raises(ParamsError, match=None) as err:
        cls.read(p)
    assert needle in str(err.value)
    assert str(p) in str(err.value)


def test_datasets_nested_validation(tmp_path):
    p = write(
        tmp_path,
        "datasets:\n  a:\n    prep: {format: sharegpt, path: x.json}\n"
        "    generate: {budget_tokens: 10}\n  b:\n    prep: {format: sharegpt}\n",
    )
    with pytest.raises(ParamsError) as err:
        read_datasets(p)
    assert "datasets.b.prep.path: required key is missing" in str(err.value)
    p = write(
        tmp_path,
        "datasets:\n  a:\n    prep: {format: sharegpt, path: x.json}\n"
        "    generate: {budget_tokens: 10}\n",
    )
    a = read_dataset("a", p)
    assert a.generate.budget_tokens == 10 and a.expect.reasoning and not a.expect.tool_calls
    with pytest.raises(ParamsError, match=r"datasets.c: no such dataset; defined: \['a'\]"):
        read_dataset("c", p)
    assert a.prep.regenerate == "last_turn"
    p = write(
        tmp_path,
        "datasets:\n  a:\n    prep: {format: sharegpt, path: x.json, regenerate: every_turn}\n",
    )
    with pytest.raises(
        ParamsError,
        match=r"datasets.a.prep.regenerate: 'every_turn' is "
        r"not one of \['last_turn', 'all_turns', 'all_turns_rendered'\]",
    ):
        read_datasets(p)


def test_missing_params_file(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        MergeParams.read(tmp_path / "nope.yaml")


def test_project_params_file_is_valid():
    for cls in (TargetParams, GenerateParams, MergeParams, QualityParams):
        cls.read()
    assert len(read_datasets()) >= 4


def test_params_are_read_by_yaml_1_2_as_dvc_reads_them(tmp_path):
    """`3e-3` is a float and `yes` a string, as DVC's reader has them."""
    p = write(tmp_path, "train: {lr: 3e-3}\ntarget: {path: yes}\n")
    assert load_params(p) == {"train": {"lr": 0.003}, "target": {"path": "yes"}}
    assert TrainParams.read(p).lr == 0.003


def test_a_key_written_twice_is_refused_naming_the_line(tmp_path):
    p = write(tmp_path, "merge:\n  seed: 1\n  seed: 2\n")
    with pytest.raises(ParamsError, match=r"not valid YAML at line 3"):
        load_params(p)


def test_an_edited_file_is_read_again(tmp_path):
    p = write(tmp_path, "merge: {seed: 1}\n")
    assert MergeParams.read(p).seed == 1
    p.write_text("merge: {seed: 2}\n")
    assert MergeParams.read(p).seed == 2
