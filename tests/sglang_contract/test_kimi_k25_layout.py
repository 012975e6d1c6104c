"""The Kimi-K2.5 layout the tests build (tests/mla_target.py `k25_layout`) against each
release: its vision config has every key SGLang's KimiK25VisionConfig takes and every `config.`
key its MoonViT tower and projector read (models/kimi_k25.py, outside the wrapper class), so
SGLang builds the tower from the test's values, none from the 27-layer defaults."""

from __future__ import annotations

import ast

import pytest

from stages.capture.releases import SUPPORTED_VERSIONS
from tests.mla_target import tiny_vision_config

from .release import Release, require

pytestmark = pytest.mark.releases


def vision_keys(release: Release) -> set[str]:
    """The keys the release's vision config takes and its tower and projector read."""
    model = release.module("sglang.srt.models.kimi_k25")
    assert model is not None
    read = {
        n.attr
        for node in model.tree.body
        if isinstance(node, ast.ClassDef | ast.FunctionDef)
        and node.name != "KimiK25ForConditionalGeneration"
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config"
    }
    init = release.cls("sglang.srt.configs.kimi_k25", "KimiK25VisionConfig").own_method("__init__")
    assert init is not None
    return read | {a.arg for a in init.args.args[1:]}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_the_tiny_vision_config_has_every_key_the_release_reads(version):
    keys = vision_keys(require(version))
    assert {"vt_hidden_size", "num_hidden_layers", "merge_kernel_size"} <= keys
    missing = keys - set(tiny_vision_config(64))
    assert not missing, f"SGLang {version} reads {sorted(missing)}"


def test_a_key_left_out_is_named():
    config = tiny_vision_config(64)
    del config["vt_hidden_size"]
    assert "vt_hidden_size" in vision_keys(require("0.5.17")) - set(config)
