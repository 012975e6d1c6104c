"""The fused attention path (flex attention, what a GPU runs) against the reference einsums,
on the CPU at small shapes: the same outputs for the prefix, every chain length, padding and
grouped kv heads, and the same training-time-test loss through the whole drafter. (Flex has
no backward on the CPU: the gradients are compared on a GPU by
`python -m tests.perf.bench_train --check`.)"""

from __future__ import annotations

import copy

import pytest
import torch

from stages.drafter.model import FLEX_MIN_HEAD_DIM, DraftKV, attend, attend_flex
from stages.drafter.ttt import ttt_forward

from .conftest import HIDDEN, make_drafter, tiny_target_config


@pytest.mark.slow
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("chain", [0, 1, 3, 7])
@pytest.mark.parametrize("T", [45, 300])  # one block; three, the last one partly padding
def test_flex_equals_the_reference(heads, kv_heads, chain, T):
    g = torch.Generator().manual_seed(heads * 10 + chain + T)
    B, d = 2, 16

    def rand(*shape):
        return torch.randn(*shape, generator=g)

    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 31:] = False  # right padding in the second sample
    mask[0, : T // 10] = False  # left padding in the first
    kv = DraftKV(
        rand(B, kv_heads, T, d),
        rand(B, kv_heads, T, d),
        mask,
        torch.arange(T),
        [rand(B, kv_heads, T, d) for _ in range(chain)],
        [rand(B, kv_heads, T, d) for _ in range(chain)],
    )
    q = rand(B, heads, T, d)
    torch.testing.assert_close(attend_flex(q, kv), attend(q, kv), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_the_training_time_test_loss_is_the_same_with_either_path():
    target = tiny_target_config()
    drafter = make_drafter(target)
    g = torch.Generator().manual_seed(3)
    B, T = 2, 33
    aux = torch.randn(B, T, 3 * HIDDEN, generator=g)
    last = torch.randn(B, T, HIDDEN, generator=g)
    ids = torch.randint(target.vocab_size, (B, T), generator=g)
    attention = torch.ones(B, T, dtype=torch.bool)
    attention[0, 25:] = False
    embed = torch.randn(target.vocab_size, HIDDEN, generator=g)
    head = torch.randn(target.vocab_size, HIDDEN, generator=g)
    losses = {}
    for impl in ("reference", "flex"):
        drafter.midlayer.self_attn.impl = impl
        with torch.no_grad():
            loss, metrics = ttt_forward(
                drafter, embed, aux, last, ids, attention, attention, 5, 0.8, head
            )
        losses[impl] = (loss, metrics.accuracy)
    torch.testing.assert_close(losses["flex"][0], losses["reference"][0], rtol=1e-5, atol=1e-6)
    assert losses["flex"][1] == losses["reference"][1]


def test_auto_takes_flex_on_a_gpu_over_a_prefix_of_heads_16_wide_or_more():
    """Narrower heads (a tiny target's) take the reference: flex's kernel refuses them."""
    wide = make_drafter(tiny_target_config()).midlayer.self_attn
    narrow = copy.deepcopy(wide)
    narrow.head_dim = FLEX_MIN_HEAD_DIM // 2
    assert wide.head_dim >= FLEX_MIN_HEAD_DIM
    assert wide.uses_flex(on_gpu=True, queries=64)
    assert not wide.uses_flex(on_gpu=False, queries=64)
    assert not wide.uses_flex(on_gpu=True, queries=1)  # decoding: one query per sample
    assert not narrow.uses_flex(on_gpu=True, queries=64)
    narrow.impl = "flex"
    assert narrow.uses_flex(on_gpu=True, queries=64)
