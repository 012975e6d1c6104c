"""The model types the check stage refuses for the sglang capture engine
(stages/target_model/architecture.py) against each release: every config class a release's
hybrid detection names (configs/hybrid_arch.py from 0.5.16; ModelRunner's *_config properties
before) has its `model_type` in the list."""

from __future__ import annotations

import ast
import importlib

import pytest

from stages.capture.releases import SUPPORTED_VERSIONS
from stages.target_model.architecture import RECURRENT_MODEL_TYPES

from .release import Class, Release, require

pytestmark = pytest.mark.releases

HYBRID_ARCH = "sglang.srt.configs.hybrid_arch"
RUNNER = "sglang.srt.model_executor.model_runner"


def detection(release: Release) -> tuple[str, list[ast.FunctionDef]]:
    """(module, the functions) where the release decides that a config is a hybrid."""
    module = release.module(HYBRID_ARCH)
    if module is not None:
        return HYBRID_ARCH, [f for f in module.tree.body if isinstance(f, ast.FunctionDef)]
    runner = release.cls(RUNNER, "ModelRunner")
    wanted = ("mamba2_config", "mambaish_config", "hybrid_gdn_config", "kimi_linear_config")
    return RUNNER, [
        f for f in runner.node.body if isinstance(f, ast.FunctionDef) and f.name in wanted
    ]


def model_type(release: Release, module: str, name: str) -> str | None:
    """The `model_type` the config class `name` declares, itself or through its bases (one from
    transformers is imported to ask it)."""
    symbol = release.lookup(module, name)
    if symbol is None:
        return None
    if symbol.kind == "external":
        source, _, attr = symbol.qualname.rpartition(".")
        return getattr(getattr(importlib.import_module(source), attr, None), "model_type", None)
    if symbol.kind != "class":
        return None
    cls = Class(symbol)
    for k in cls.mro():
        for stmt in k.node.body:
            if not isinstance(stmt, ast.Assign | ast.AnnAssign):
                continue
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            if ast.unparse(target) == "model_type" and isinstance(stmt.value, ast.Constant):
                return str(stmt.value.value)
    for base in cls.external_bases():
        source, _, attr = base.rpartition(".")
        found = getattr(getattr(importlib.import_module(source), attr, None), "model_type", "")
        if found:
            return str(found)
    return None


def hybrid_model_types(release: Release) -> dict[str, str | None]:
    module, functions = detection(release)
    names = {
        n.id
        for f in functions
        for n in ast.walk(f)
        if isinstance(n, ast.Name) and n.id.endswith("Config") and n.id != "ModelConfig"
    }
    assert names, f"SGLang {release.version}: no hybrid config classes found in {module}"
    return {name: model_type(release, module, name) for name in sorted(names)}


def unrefused(version: str, refused: frozenset[str]) -> dict[str, str | None]:
    """The release's hybrid config classes whose model type `refused` lacks."""
    types = hybrid_model_types(require(version))
    return {name: t for name, t in types.items() if t is None or t not in refused}


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_every_hybrid_config_class_of_the_release_is_refused(version):
    assert not unrefused(version, RECURRENT_MODEL_TYPES), f"SGLang {version}"
    types = set(hybrid_model_types(require(version)).values())
    assert {"qwen3_next", "kimi_linear", "nemotron_h"} <= types


def test_a_model_type_left_out_fails_the_check():
    """Qwen3-Next's gated delta net dropped from the list: named by every release (and
    transformers' own classes that SGLang subclasses are read through)."""
    dropped = RECURRENT_MODEL_TYPES - {"qwen3_next"}
    for version in SUPPORTED_VERSIONS:
        assert unrefused(version, dropped) == {"Qwen3NextConfig": "qwen3_next"}, version
    assert hybrid_model_types(require("0.5.23"))["Lfm2Config"] == "lfm2"
