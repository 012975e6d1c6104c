"""docs/params.md is generated from the typed params and current; every key says what it does;
a number out of its key's range stops the build naming the key and the range."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import yaml

from stages.params.schema import load_params
from stages.params.sections import SECTIONS
from stages.params.vocab import VocabParams
from stages.runtime.errors import ParamsError
from tests.conftest import ROOT


def params_doc():
    spec = importlib.util.spec_from_file_location("params_doc", ROOT / "tools" / "params_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_is_current():
    doc = params_doc()
    assert (ROOT / "docs" / "params.md").read_text() == doc.render(), (
        "docs/params.md is stale: run `python tools/params_doc.py`"
    )
    assert doc.main(["--check"]) == 0


def test_every_key_says_what_it_does_and_every_section_is_there():
    doc = params_doc()
    assert doc.undocumented() == []
    page = doc.render()
    for section in SECTIONS:
        assert f"## `{section}" in page
    # every key params.yaml sets appears on the page under its section
    raw = load_params(ROOT / "params.yaml")
    for section, values in raw.items():
        if section == "datasets":
            continue
        for key in values:
            assert f"| `{key}` |" in page, f"{section}.{key}"


def test_a_changed_help_text_makes_the_page_stale(monkeypatch):
    doc = params_doc()
    before = doc.render()
    field = next(f for f in dataclasses.fields(VocabParams))
    monkeypatch.setattr(field, "metadata", {**field.metadata, "help": "Something else."})
    assert doc.render() != before


@pytest.mark.parametrize(
    "section, values, says",
    [
        ("train", {"batch_size": 0}, "train.batch_size: 0 is out of range; allowed: >= 1"),
        ("generate", {"top_p": 1.5}, "generate.top_p: 1.5 is out of range; allowed: > 0 and <= 1"),
        ("merge", {"eval_fraction": -0.1}, "merge.eval_fraction: -0.1 is out of range"),
        (
            "quality",
            {"max_failed": 2},
            "quality.max_failed: 2.0 is out of range; allowed: >= 0 and <= 1",
        ),
    ],
)
def test_a_number_out_of_range_names_the_key(section, values, says, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({section: values}))
    with pytest.raises(ParamsError) as err:
        SECTIONS[section].read(params)
    assert says in str(err.value)


@pytest.mark.parametrize(
    "override, line",
    [("train.lr=0.01", "  lr: 0.01"), ("merge.seed=7", "  seed: 7")],
)
def test_dvc_exp_run_set_rewrites_only_the_key_it_sets(tmp_path, override, line):
    """`dvc exp run -S` writes params.yaml through dvc.utils.hydra.apply_overrides: every other
    line, comments and layout included, stays as it was."""
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "params.yaml").read_text())
    apply_overrides(path, [override])
    before = (ROOT / "params.yaml").read_text().splitlines()
    after = path.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 1, changed
    assert changed[0][1].startswith(line), changed
