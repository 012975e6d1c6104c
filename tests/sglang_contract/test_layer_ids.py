"""The layer-id conventions of stages/drafter/layers.py against each supported release's own
`set_eagle3_layers_to_capture` (models/llama.py, models/deepseek_v2.py, and Kimi-K2.5's wrapper
in models/kimi_k25.py), run from the release's source on a stand-in `self`."""

from __future__ import annotations

import ast
import typing
from types import SimpleNamespace

import pytest

from stages.drafter.layers import sglang_captured_indices

from .release import Release, require, supported_versions

pytestmark = pytest.mark.releases

NUM_LAYERS = 61  # Kimi-K2.5's depth; the ids below cover every branch of both rules
ID_LISTS = ([1, 30, 58], [0, 30, 58], [2, 31, 59], [3, 7], None)
FAMILIES = {  # release module -> an architecture layers.py files under that family
    "llama": "LlamaForCausalLM",
    "deepseek_v2": "DeepseekV3ForCausalLM",
}


@pytest.fixture(params=supported_versions())
def release(request):
    return require(request.param)


def release_method(release: Release, module: str, name: str):
    """The first class's `name` in the release's `models/<module>.py`, compiled on its own."""
    tree = release.module(f"sglang.srt.models.{module}")
    assert tree is not None, f"SGLang {release.version} has no models/{module}.py"
    for cls in tree.tree.body:
        if isinstance(cls, ast.ClassDef):
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == name:
                    namespace = {**vars(typing)}
                    exec(compile(ast.Module([fn], []), f"{module}.py", "exec"), namespace)
                    return namespace[name]
    raise AssertionError(f"SGLang {release.version}: models/{module}.py has no {name}")


def captured_by_release(method, ids) -> list[int]:
    model = SimpleNamespace(layers_to_capture=[])
    me = SimpleNamespace(
        pp_group=SimpleNamespace(is_last_rank=True),
        config=SimpleNamespace(num_hidden_layers=NUM_LAYERS),
        model=model,
        capture_aux_hidden_states=False,
    )
    method(me, None if ids is None else list(ids))
    assert me.capture_aux_hidden_states
    return model.layers_to_capture


@pytest.mark.parametrize("module", sorted(FAMILIES))
def test_capture_rule_matches_release(release, module):
    method = release_method(release, module, "set_eagle3_layers_to_capture")
    for ids in ID_LISTS:
        ours = sglang_captured_indices(FAMILIES[module], ids, NUM_LAYERS, release.version)
        theirs = captured_by_release(method, ids)
        assert ours == theirs, (
            f"SGLang {release.version} models/{module}.py captures {theirs} for ids {ids}; "
            f"stages/drafter/layers.py says {ours}"
        )


def test_kimi_k25_passes_ids_on(release):
    """Kimi-K2.5's wrapper hands the ids to its DeepSeek language model unchanged, so the
    deepseek_v2 rule is the one that holds (layers.py's kimi_k25 rows say so)."""
    method = release_method(release, "kimi_k25", "set_eagle3_layers_to_capture")
    given = []
    language_model = SimpleNamespace(set_eagle3_layers_to_capture=given.append)
    method(SimpleNamespace(language_model=language_model), [1, 30, 58])
    assert given == [[1, 30, 58]]
    assert sglang_captured_indices(
        "KimiK25ForConditionalGeneration", [1, 30, 58], NUM_LAYERS, release.version
    ) == sglang_captured_indices("DeepseekV3ForCausalLM", [1, 30, 58], NUM_LAYERS, release.version)
