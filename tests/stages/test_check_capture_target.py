"""The check stage refuses, for the sglang capture engine, a target whose layers keep a recurrent
state (Mamba, linear attention), naming the key, the architecture and the model type; a
transformer target, wrapped (Kimi-K2.5's layout) or not, passes, and so does any target under
the hf engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages.check import check_capture_target
from stages.runtime.errors import ParamsError


def target(tmp_path: Path, config: dict) -> Path:
    path = tmp_path / "target"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


def params(tmp_path: Path, engine: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(f"extract:\n  engine: {engine}\n")
    return path


QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next"}
KIMI_LINEAR_WRAPPED = {
    "architectures": ["SomeVLForConditionalGeneration"],
    "model_type": "some_vl",
    "text_config": {"model_type": "kimi_linear"},
}
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {"model_type": "kimi_k2"},
}


@pytest.mark.parametrize(
    "config, named",
    [(QWEN3_NEXT, "Qwen3NextForCausalLM, model type qwen3_next"), (KIMI_LINEAR_WRAPPED, "kimi_")],
)
def test_a_recurrent_target_is_refused_for_the_sglang_engine(tmp_path, config, named):
    path = target(tmp_path, config)
    with pytest.raises(ParamsError) as err:
        check_capture_target(params(tmp_path, "sglang"), str(path))
    assert "extract.engine" in str(err.value) and named in str(err.value)
    assert "extract.engine hf" in str(err.value)


def test_transformer_targets_and_the_hf_engine_pass(tmp_path):
    check_capture_target(params(tmp_path, "sglang"), str(target(tmp_path, KIMI_K25)))
    (tmp_path / "hf").mkdir()
    check_capture_target(params(tmp_path / "hf", "hf"), str(target(tmp_path / "hf", QWEN3_NEXT)))
