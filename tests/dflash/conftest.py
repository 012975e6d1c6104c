"""DFlash drafters built on the tiny Llama target (tests/tiny_llama.py), shared by the DFlash
tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.dflash.model import DFlashConfig, DFlashDrafter
from tests.tiny_llama import LAYERS as LAYERS  # the DFlash tests import the shapes from here
from tests.tiny_llama import VOCAB, tiny_target, tiny_target_config
from tests.tiny_llama import one_thread as one_thread  # a fixture, registered by import

MASK_ID = VOCAB - 1
AUX = [2, 4, 5]  # the EAGLE-3 capture's default HF indices [2, N // 2, N - 3] at 8 layers


def make_drafter(target_config, seed: int = 1, **overrides) -> DFlashDrafter:
    """A random two-layer drafter with blocks of 4 whose norms are not all ones, so that a
    swapped or skipped norm changes the outputs."""
    values = dict(num_hidden_layers=2, block_size=4, mask_token_id=MASK_ID, aux_hf_indices=AUX)
    cfg = DFlashConfig.from_target(target_config, **{**values, **overrides})
    torch.manual_seed(seed)
    drafter = DFlashDrafter(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
    return drafter


@pytest.fixture
def target_config() -> LlamaConfig:
    return tiny_target_config()


@pytest.fixture
def target(target_config) -> LlamaForCausalLM:
    return tiny_target(target_config)


@pytest.fixture
def drafter(target_config) -> DFlashDrafter:
    return make_drafter(target_config)


def random_batch(cfg, lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """A right-padded batch as `collate` builds it: features, ids, a loss mask with an unsupervised
    prompt and a gap, and the attention mask of the lengths."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    attention = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    loss_mask = (torch.arange(T)[None] >= 3) & attention
    loss_mask[:, 8:9] = False
    width = len(cfg.target_layer_ids) * cfg.target_hidden_size
    return dict(
        aux=torch.randn(B, T, width, generator=g) * attention[..., None],
        input_ids=torch.randint(0, cfg.vocab_size - 1, (B, T), generator=g) * attention,
        loss_mask=loss_mask,
        attention_mask=attention,
    )


def target_weights(cfg, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed, lm_head) [vocab, hidden] standing in for the target's frozen weights."""
    g = torch.Generator().manual_seed(seed)
    shape = (cfg.vocab_size, cfg.hidden_size)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g) * 0.2
