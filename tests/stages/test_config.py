import pytest

from stages import config


def write(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


def test_section_builds_typed_values_and_defaults(tmp_path):
    p = write(tmp_path, "merge: {seed: 3, eval_fraction: 1}\n")
    m = config.section(config.MergeParams, "merge", p)
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
    cls = config.GenerateParams if "generate" in text else config.MergeParams
    with pytest.raises(config.ParamsError, match=None) as err:
        config.section(cls, text.split(":")[0], p)
    assert needle in str(err.value)
    assert str(p) in str(err.value)


def test_datasets_nested_validation(tmp_path):
    p = write(
        tmp_path,
        "datasets:\n  a:\n    prep: {format: sharegpt, path: x.json}\n"
        "    generate: {budget_tokens: 10}\n  b:\n    prep: {format: sharegpt}\n",
    )
    with pytest.raises(config.ParamsError) as err:
        config.datasets(p)
    assert "datasets.b.prep.path: required key is missing" in str(err.value)
    p = write(
        tmp_path,
        "datasets:\n  a:\n    prep: {format: sharegpt, path: x.json}\n"
        "    generate: {budget_tokens: 10}\n",
    )
    a = config.dataset("a", p)
    assert a.generate.budget_tokens == 10 and a.expect.reasoning and not a.expect.tool_calls
    with pytest.raises(config.ParamsError, match=r"datasets.c: no such dataset; defined: \['a'\]"):
        config.dataset("c", p)
    assert a.prep.regenerate == "last_turn"
    p = write(
        tmp_path,
        "datasets:\n  a:\n    prep: {format: sharegpt, path: x.json, regenerate: every_turn}\n",
    )
    with pytest.raises(
        config.ParamsError,
        match=r"datasets.a.prep.regenerate: 'every_turn' is "
        r"not one of \['last_turn', 'all_turns', 'all_turns_rendered'\]",
    ):
        config.datasets(p)


def test_missing_params_file(tmp_path):
    with pytest.raises(config.ParamsError, match="not found"):
        config.section(config.MergeParams, "merge", tmp_path / "nope.yaml")


def test_project_params_file_is_valid():
    for cls, name in [
        (config.TargetParams, "target"),
        (config.GenerateParams, "generate"),
        (config.MergeParams, "merge"),
        (config.QualityParams, "quality"),
    ]:
        config.section(cls, name)
    assert len(config.datasets()) >= 4
