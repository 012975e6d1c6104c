"""A tiny random Llama target, shared by the tests of both drafter families (tests/drafter and
tests/dflash import it into their conftest, which registers the fixture)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, HIDDEN, LAYERS = 300, 64, 8


def tiny_target_config(**overrides) -> LlamaConfig:
    values = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        architectures=["LlamaForCausalLM"],
    )
    return LlamaConfig(**{**values, **overrides})


def tiny_target(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(autouse=True)
def one_thread():
    """The models here are tiny: thread start-up and contention cost more than the math."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
