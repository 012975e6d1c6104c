"""A tiny random Llama target and drafters built from it, shared by the drafter tests."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from stages.drafter.layers import default_aux_indices
from stages.drafter.model import Eagle3Config, Eagle3Drafter
from stages.drafter.vocab import build_draft_vocab
from tests.tiny_llama import HIDDEN as HIDDEN  # the drafter tests import the shapes from here
from tests.tiny_llama import LAYERS, tiny_target, tiny_target_config
from tests.tiny_llama import VOCAB as VOCAB
from tests.tiny_llama import one_thread as one_thread  # a fixture, registered by import

DRAFT_VOCAB = 120


@pytest.fixture(scope="session")
def target_config() -> LlamaConfig:
    return tiny_target_config()


@pytest.fixture(scope="session")
def target(target_config) -> LlamaForCausalLM:
    return tiny_target(target_config)


def make_drafter(target_config, seed: int = 1, draft_vocab: int = DRAFT_VOCAB) -> Eagle3Drafter:
    """A random drafter whose norms are not all ones and whose vocabulary is a scattered subset,
    so a swapped norm or a dropped d2t offset changes the outputs."""
    cfg = Eagle3Config.from_target(target_config, draft_vocab, default_aux_indices(LAYERS))
    g = torch.Generator().manual_seed(seed)
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        for _name, p in drafter.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
        counts = torch.randint(0, 50, (cfg.vocab_size,), generator=g)
        d2t, t2d, _ = build_draft_vocab(counts, draft_vocab)
        drafter.set_vocab(d2t, t2d)
    return drafter.eval()


@pytest.fixture
def drafter(target_config) -> Eagle3Drafter:
    return make_drafter(target_config)


def features(target, ids: torch.Tensor, aux_indices) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [B, T, 3H], logits [B, T, V]) of the target over `ids` [B, T]."""
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in aux_indices], dim=-1), out.logits
