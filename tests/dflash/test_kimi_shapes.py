"""DFlash for a Kimi-K2.5-shaped target: multi-head latent attention (no Llama head to copy),
yarn RoPE, and its vocabulary; the config at full size, a forward and backward at test widths."""

from __future__ import annotations

import pytest
import torch

from stages.dflash.export import check_export, export_dflash
from stages.dflash.model import DFlashConfig, DFlashDrafter
from stages.dflash.objective import DFlashObjective
from stages.drafter.export import ExportError
from stages.drafter.model import rope_magnitude
from tests.drafter.test_kimi_shapes import KIMI_K25
from tests.mla_target import KIMI_YARN, deepseek_config

from .conftest import random_batch, target_weights


def test_kimi_k25_config_from_its_published_shapes():
    cfg = DFlashConfig.from_target(
        KIMI_K25, num_hidden_layers=5, block_size=16, mask_token_id=163839
    )
    assert (cfg.hidden_size, cfg.vocab_size, cfg.num_target_layers) == (7168, 163840, 61)
    assert (cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads) == (128, 64, 64)
    assert cfg.target_layer_ids == (1, 15, 30, 44, 58)  # SGLang's default for 5 draft layers
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "yarn"
    assert cfg.max_position_embeddings == 262144
    eagle_capture = DFlashConfig.from_target(
        KIMI_K25,
        num_hidden_layers=2,
        block_size=16,
        mask_token_id=163839,
        aux_hf_indices=[2, 30, 58],
    )
    assert eagle_capture.target_layer_ids == (1, 29, 57)


@pytest.fixture
def tiny_kimi():
    return deepseek_config("tiny")


def test_a_tiny_kimi_shaped_drafter_trains_and_exports(tiny_kimi, tmp_path):
    cfg = DFlashConfig.from_target(
        tiny_kimi, num_hidden_layers=2, block_size=4, mask_token_id=2047, aux_hf_indices=[2, 4, 5]
    )
    assert (cfg.head_dim, cfg.num_key_value_heads) == (16, 4)  # v_head_dim; one kv per query head
    kimi_yarn = {k: v for k, v in KIMI_YARN.items() if k != "type"}
    assert cfg.rope_scaling == {"rope_type": "yarn", **kimi_yarn}
    torch.manual_seed(0)
    drafter = DFlashDrafter(cfg)
    assert drafter.rope_magnitude == pytest.approx(rope_magnitude(cfg.rope_scaling))
    embed, lm_head = target_weights(cfg)
    objective = DFlashObjective(drafter, embed, lm_head, num_anchors=4, decay_gamma=4.0)
    loss, metrics = objective(random_batch(cfg, [40, 33]))
    loss.backward()
    assert torch.isfinite(loss) and metrics.blocks == 8
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.parameters())
    with pytest.raises(ExportError, match="SGLang before 0.5.16 serves 1.4159"):
        export_dflash(drafter, tmp_path / "kimi", tiny_kimi)  # any release: 0.5.14 too
    out = export_dflash(drafter, tmp_path / "kimi", tiny_kimi, sglang_version="0.5.16")
    check_export(out, tiny_kimi, sglang_version="0.5.23")
