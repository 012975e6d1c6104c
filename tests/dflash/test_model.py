"""The draft model's config and forward: SGLang's default target layers, the HF indices the
features must hold, and many blocks in one masked forward equal to drafting each block alone after
its prefix, as the serving worker does."""

from __future__ import annotations

import pytest
import torch

from stages.dflash.layers import default_target_layer_ids, layer_ids_from_hf_indices
from stages.dflash.model import DFlashConfig
from stages.dflash.objective import block_tokens, block_visibility, sample_anchors

from .conftest import AUX, LAYERS, MASK_ID, make_drafter, random_batch, target_weights


@pytest.mark.parametrize(
    "target_layers, draft_layers, ids",
    [
        # computed by hand from dflash_utils.py build_target_layer_ids (0.5.14 .. 0.5.23):
        (36, 5, [1, 9, 17, 25, 33]),  # span 32 / 4 = 8 (a published Qwen3-8B drafter's ids)
        (61, 5, [1, 15, 30, 44, 58]),  # Kimi-K2.5: 1 + 28.5 = 29.5 rounds half to even, 30
        (7, 3, [1, 2, 4]),  # 1 + 1.5 = 2.5 rounds to 2, not 3
        (28, 1, [14]),  # one draft layer: the middle one
    ],
)
def test_default_target_layer_ids_are_sglangs(target_layers, draft_layers, ids):
    assert default_target_layer_ids(target_layers, draft_layers) == ids


def test_default_target_layer_ids_refuse_a_target_too_shallow():
    with pytest.raises(ValueError, match="at least 4"):
        default_target_layer_ids(3, 2)


def test_layer_ids_are_the_hf_indices_minus_one(target_config):
    assert layer_ids_from_hf_indices(AUX) == [1, 3, 4]
    cfg = make_drafter(target_config).cfg
    assert cfg.hf_indices == tuple(AUX)
    with pytest.raises(ValueError, match="index 0 is the embedding output"):
        layer_ids_from_hf_indices([0, 4])
    default = DFlashConfig.from_target(
        target_config, num_hidden_layers=3, block_size=8, mask_token_id=MASK_ID
    )
    assert default.target_layer_ids == (1, 3, 5) and default.num_target_layers == LAYERS


@pytest.mark.parametrize(
    "override, message",
    [
        (dict(hidden_size=32), "as wide as its target"),
        (dict(block_size=1), "block_size 1"),
        (dict(mask_token_id=300), "mask_token_id 300 is outside"),
        (dict(target_layer_ids=(1, 8)), r"target_layer_ids \[1, 8\]"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "original_max_position"),
    ],
)
def test_a_config_serving_would_run_otherwise_is_refused(target_config, override, message):
    with pytest.raises(ValueError, match=message):
        DFlashConfig.from_target(
            target_config,
            num_hidden_layers=1,
            **{"block_size": 4, "mask_token_id": MASK_ID, **override},
        )


@pytest.mark.parametrize("impl", ["reference", "flex"])
def test_blocks_in_one_masked_forward_equal_each_block_drafted_after_its_prefix(drafter, impl):
    """Either form of the mask (dense through SDPA; flex attention's block mask, what a GPU
    runs) gives each block what it gets alone, drafted as serving drafts it."""
    for layer in drafter.layers:
        layer.self_attn.impl = impl
    cfg = drafter.cfg
    batch = random_batch(cfg, [24, 17])
    embed, _ = target_weights(cfg)
    anchors = sample_anchors(batch["loss_mask"], batch["attention_mask"], 4, 3)
    ids, positions = block_tokens(batch["input_ids"], anchors, 4, MASK_ID)
    visible = block_visibility(anchors, 4)
    with torch.no_grad():
        together = drafter(embed[ids], positions, batch["aux"], visible).view(2, 3, 4, -1)
        for b, n in anchors.valid.nonzero().tolist():
            a = int(anchors.positions[b, n])
            block = ids.view(2, 3, 4)[b : b + 1, n]
            alone = drafter(embed[block], a + torch.arange(4)[None], batch["aux"][b : b + 1, :a])
            torch.testing.assert_close(together[b, n], alone[0], rtol=1e-5, atol=1e-6)
