"""The training-time-test block mask (`ttt_mask`) against the attention `attend` computes,
element by element: what the flex kernel attends to (every pair of a full block, the mask's
pairs in a partial block, nothing elsewhere) must be exactly the reference's allowed pairs.
(The CPU's flex attention ignores the block lists and evaluates the mask everywhere, so the
output comparison in test_flex_attention cannot see a wrong block list; this test does.)"""

from __future__ import annotations

import pytest
import torch

from stages.drafter.ttt_mask import BLOCK, padded_length, ttt_block_mask
from tests.flex_blocks import (
    assert_query_lists_are_the_transpose,
    assert_the_mask_captures_no_length_expression,
    kernel_pairs,
)


def reference_pairs(key_mask: torch.Tensor, chains: int) -> torch.Tensor:
    """[B, T, keys] bool: what `attend` lets query q see, in the padded key layout."""
    batch, length = key_mask.shape
    q = torch.arange(length)[:, None]
    k = torch.arange(padded_length(length))[None, :]
    own = (k == q).expand(batch, -1, -1)  # itself, and its entry of each chain
    prefix = own.clone()
    prefix[:, :, :length] |= (k[:, :length] <= q) & key_mask[:, None, :]
    return torch.cat([prefix] + [own] * chains, dim=2)


MASKS = {
    "unpadded": lambda length: torch.ones(length, dtype=torch.bool),
    "right padding": lambda length: torch.arange(length) < (length * 3) // 5,
    "left padding and a hole": lambda length: (
        (torch.arange(length) >= 20)
        & ((torch.arange(length) < length // 2) | (torch.arange(length) > length // 2 + 130))
    ),
}


@pytest.mark.parametrize("length", [45, 128, 300, 513])
@pytest.mark.parametrize("chains", [0, 1, 3])
def test_the_kernel_attends_exactly_the_pairs_the_reference_allows(length, chains):
    key_mask = torch.stack([MASKS["unpadded"](length), MASKS["right padding"](length)])
    if length > 200:
        key_mask = torch.cat([key_mask, MASKS["left padding and a hole"](length)[None]])
    mask = ttt_block_mask(key_mask, chains)
    assert mask.seq_lengths == (length, (1 + chains) * padded_length(length))
    torch.testing.assert_close(kernel_pairs(mask, length), reference_pairs(key_mask, chains))


@pytest.mark.parametrize("chains", [0, 2])
def test_the_query_lists_are_the_transpose_of_the_key_lists(chains):
    length = 300
    key_mask = torch.stack([MASKS[name](length) for name in MASKS])
    assert_query_lists_are_the_transpose(ttt_block_mask(key_mask, chains))


def test_only_the_diagonal_and_the_chain_blocks_are_partial_without_padding():
    """Block sparsity as the kernel sees it: row i of an unpadded sample computes i + 1 prefix
    blocks (i of them full) and one block per chain step, not the whole key range."""
    length, chains = 1000, 3
    mask = ttt_block_mask(torch.ones(1, length, dtype=torch.bool), chains)
    rows = torch.arange(-(-length // BLOCK))
    assert mask.full_kv_num_blocks[0, 0].tolist() == rows.tolist()
    assert mask.kv_num_blocks[0, 0].tolist() == [1 + chains] * len(rows)


@pytest.mark.slow
def test_it_traces_with_dynamic_lengths():
    """Compiled with symbolic lengths (as the objective is after its second batch shape), the
    block lists equal the eager ones at lengths that add blocks."""
    torch._dynamo.reset()

    def lists(key_mask):
        return ttt_block_mask(key_mask, 2).as_tuple()[2:10]

    compiled = torch.compile(lists, dynamic=True, backend="aot_eager")
    for length in (200, 300, 700):
        key_mask = MASKS["right padding"](length)[None].repeat(2, 1)
        for got, want in zip(compiled(key_mask), lists(key_mask), strict=True):
            assert torch.equal(got, want)


@pytest.mark.slow
def test_the_mask_captures_no_length_expression_under_dynamic_lengths():
    """Traced with symbolic lengths, what the element mask reads must be tensors or bare size
    symbols: a captured expression (a padded length, `length - 1`) reaches inductor's flex
    lowering as a constant buffer it cannot realise (on an H200, torch 2.11: the objective's
    recompile for a second length failed with `'ShapeAsConstantBuffer' object has no attribute
    'dtype'`). The CPU has no compiled flex backward to show it, so this reads the traced graph."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    def attention(q, k, key_mask):
        pad = (0, 0, 0, padded_length(q.shape[2]) - q.shape[2])
        keys = F.pad(torch.stack([k, k], 2), pad).flatten(2, 3)
        return flex_attention(q, keys, keys, block_mask=ttt_block_mask(key_mask, 1))

    calls = []
    for length in (200, 300):
        q, k = torch.randn(2, 1, 2, length, 16)
        calls.append((q, k, MASKS["right padding"](length)[None]))
    assert_the_mask_captures_no_length_expression(attention, calls)
