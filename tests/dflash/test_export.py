"""The export writes what SGLang's DFLASH worker loads, and its check refuses anything else,
naming the key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from stages.dflash.export import check_export, export_dflash, sglang_view
from stages.drafter.export import CONFIG_FILE, WEIGHTS_FILE, ExportError

from .conftest import make_drafter, tiny_target_config


@pytest.fixture
def exported(tmp_path, target_config, drafter):
    return export_dflash(drafter, tmp_path / "dflash", target_config)


def rewrite_config(out, change) -> None:
    config = json.loads((out / CONFIG_FILE).read_text())
    change(config)
    (out / CONFIG_FILE).write_text(json.dumps(config))


def rewrite_weights(out, change) -> None:
    tensors = load_file(str(out / WEIGHTS_FILE))
    change(tensors)
    save_file(tensors, str(out / WEIGHTS_FILE))


def test_the_export_reloads_as_sglang_reads_it(exported, target_config, drafter):
    check_export(exported, target_config)
    config = json.loads((exported / CONFIG_FILE).read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {
        "block_size": 4,
        "target_layer_ids": [1, 3, 4],
        "num_target_layers": 8,
        "mask_token_id": 299,
    }
    assert sglang_view(config) == drafter.cfg
    weights = load_file(str(exported / WEIGHTS_FILE))
    assert not any("embed_tokens" in k or "lm_head" in k for k in weights)
    for key, value in drafter.state_dict().items():
        assert torch.equal(weights[key], value), key


def test_weights_are_written_in_the_targets_dtype(tmp_path):
    target = tiny_target_config(torch_dtype="bfloat16")
    out = export_dflash(make_drafter(target), tmp_path / "bf16", target)
    assert {t.dtype for t in load_file(str(out / WEIGHTS_FILE)).values()} == {torch.bfloat16}
    assert json.loads((out / CONFIG_FILE).read_text())["dtype"] == "bfloat16"


def renamed(tensors, old, new):
    tensors[new] = tensors.pop(old)


WRONG_WEIGHTS = [
    (
        lambda t: renamed(t, "layers.0.self_attn.q_proj.weight", "layers.0.attn.q_proj.weight"),
        "missing keys ['layers.0.self_attn.q_proj.weight']",
    ),
    (
        lambda t: t.update({"embed_tokens.weight": torch.zeros(300, 64)}),
        "unexpected keys ['embed_tokens.weight']",
    ),
    (
        lambda t: t.update({"fc.weight": torch.zeros(64, 128)}),
        "fc.weight has shape (64, 128), expected (64, 192)",
    ),
    (
        lambda t: t.update({"norm.weight": t["norm.weight"].half()}),
        "norm.weight is float16, config.json declares float32",
    ),
]
WRONG_CONFIGS = [
    (
        lambda c: c["dflash_config"].update(mask_token=c["dflash_config"].pop("mask_token_id")),
        "dflash_config: missing keys ['mask_token_id']",
    ),
    (lambda c: c.update(head_size=c.pop("head_dim")), "unexpected keys ['head_size']"),
    (
        lambda c: c.update(architectures=["LlamaForCausalLMEagle3"]),
        "architectures is ['LlamaForCausalLMEagle3'], expected ['DFlashDraftModel']",
    ),
    (
        lambda c: c["dflash_config"].update(target_layer_ids=[2, 4, 5]),
        "make SGLang capture HF hidden states [3, 5, 6]; trained on [2, 4, 5]",
    ),
    (lambda c: c.update(block_size=8), "block_size 8 differs from dflash_config.block_size 4"),
    (lambda c: c.update(max_position_embeddings=128), "max_position_embeddings 128 is below"),
    (
        lambda c: c.update(dtype="float16", torch_dtype="float16"),
        "dtype 'float16' is not the target's 'float32'",
    ),
]


@pytest.mark.parametrize(
    "rewrite, change, named",
    [(rewrite_weights, *case) for case in WRONG_WEIGHTS]
    + [(rewrite_config, *case) for case in WRONG_CONFIGS],
)
def test_a_wrong_weight_or_config_key_is_refused_by_name(
    exported, target_config, rewrite, change, named
):
    rewrite(exported, change)
    with pytest.raises(ExportError) as e:
        check_export(exported, target_config)
    assert named in str(e.value)


def test_a_drafter_for_another_target_is_refused(exported):
    with pytest.raises(ExportError, match="hidden_size is 64, the target's is 128"):
        check_export(exported, tiny_target_config(hidden_size=128))


def test_a_failed_check_leaves_nothing_behind(tmp_path, target_config, drafter):
    with pytest.raises(ExportError):
        export_dflash(drafter, tmp_path / "other", tiny_target_config(vocab_size=512))
    assert not (tmp_path / "other").exists()
