"""The SGLang stand-in builds a DeepSeek-V3 model only from a config that real SGLang's
models/deepseek_v2.py could build it from: it reads the same MoE keys (fake_core.DEEPSEEK_MOE_KEYS)
as `config.<key>`, and the test targets of tests/mla_target.py carry them, as real DeepSeek-V3
and Kimi-K2 checkpoints do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.mla_target import KIMI_MOE, SHAPES, deepseek_config, tiny_target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("deepseek") / "target")


def load(fake, path: Path, release: str = "0.5.23"):
    """The stand-in's model of the checkpoint at `path`, loaded as its ModelRunner loads it."""
    core = fake(release)
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

    return core.load_model(ModelConfig(str(path)), LogitsProcessorOutput, keep_last=False)


def test_the_saved_tiny_target_holds_every_key_sglang_reads(tiny, fake):
    keys = fake().DEEPSEEK_MOE_KEYS
    saved = json.loads((tiny / "config.json").read_text())
    assert {k: saved.get(k, "missing") for k in keys} == {k: SHAPES["tiny"][k] for k in keys}
    assert {k: saved.get(k, "missing") for k in KIMI_MOE} == KIMI_MOE  # ep_size, no MTP layer


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_writes_the_keys_sglang_reads(shape, fake, tmp_path):
    keys = fake().DEEPSEEK_MOE_KEYS
    deepseek_config(shape).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {k: saved.get(k, "missing") for k in keys} == {k: SHAPES[shape][k] for k in keys}


@pytest.mark.parametrize("release", ["0.5.14", "0.5.23"])
def test_the_stand_in_loads_the_tiny_target(tiny, fake, release):
    model = load(fake, tiny, release)
    assert type(model).__name__ == "DeepseekV2ForCausalLM"


@pytest.mark.parametrize("key", ["moe_layer_freq", "topk_method", "scoring_func"])
def test_the_stand_in_refuses_a_config_without_a_key_sglang_reads(tiny, fake, tmp_path, key):
    """Keys transformers' DeepseekV3Config has no default for: SGLang's `config.<key>` fails."""
    broken = shutil.copytree(tiny, tmp_path / "target")
    config = json.loads((broken / "config.json").read_text())
    del config[key]
    (broken / "config.json").write_text(json.dumps(config, indent=2))
    with pytest.raises(AttributeError, match=key):
        load(fake, broken)
