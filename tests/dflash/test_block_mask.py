"""The DFlash blocks' flex block mask against their dense mask, pair by pair: what the kernel
attends to (every pair of a full block, the mask's pairs in a partial block, nothing elsewhere)
must be exactly what the dense mask allows, in the padded key layout. (The CPU's flex attention
evaluates the mask everywhere, so comparing outputs there cannot see a wrong block list.)"""

from __future__ import annotations

import pytest
import torch

from stages.dflash.block_mask import BlockVisibility, block_lists
from stages.dflash.objective import block_visibility, sample_anchors
from stages.drafter.ttt_mask import BLOCK, padded_length
from tests.flex_blocks import (
    assert_query_lists_are_the_transpose,
    assert_the_mask_captures_no_length_expression,
    kernel_pairs,
)


def dense_in_padded_layout(visible: BlockVisibility, context_length: int) -> torch.Tensor:
    """The dense mask with never-seen columns where the flex layout pads the context."""
    dense = visible.dense(context_length)
    gap = dense.new_zeros(*dense.shape[:2], padded_length(context_length) - context_length)
    return torch.cat([dense[..., :context_length], gap, dense[..., context_length:]], dim=2)


def anchors_of(context_length: int, block_size: int, num_anchors: int, seed: int):
    """Anchors as training draws them, from two samples: one unpadded, one a third as long and
    with too few supervised tokens for `num_anchors` blocks (so padding blocks too)."""
    loss_mask = torch.ones(2, context_length, dtype=torch.bool)
    attention = torch.ones_like(loss_mask)
    attention[1, context_length // 3 :] = False
    loss_mask[1, num_anchors // 2 :] = False
    g = torch.Generator().manual_seed(seed)
    return sample_anchors(loss_mask, attention, block_size, num_anchors, g)


@pytest.mark.parametrize(
    "context_length, block_size, num_anchors",
    [(45, 4, 5), (300, 16, 20), (700, 16, 40), (520, 10, 30), (300, 3, 50)],
)
def test_the_kernel_attends_exactly_the_pairs_the_dense_mask_allows(
    context_length, block_size, num_anchors
):
    anchors = anchors_of(context_length, block_size, num_anchors, seed=context_length)
    assert (~anchors.valid).any(), "no padding block: the short sample should have some"
    visible = block_visibility(anchors, block_size)
    mask = visible.flex(context_length)
    queries = anchors.positions.shape[1] * block_size
    assert mask.seq_lengths == (queries, padded_length(context_length) + queries)
    torch.testing.assert_close(
        kernel_pairs(mask, queries), dense_in_padded_layout(visible, context_length)
    )


def test_the_query_lists_are_the_transpose_of_the_key_lists():
    anchors = anchors_of(700, 16, 40, seed=3)
    assert_query_lists_are_the_transpose(block_visibility(anchors, 16).flex(700))


def test_a_row_of_blocks_computes_the_context_before_its_anchors_and_one_block_of_its_own():
    """Block sparsity as the kernel sees it, at dflash's block of 16: a row of 128 queries (8
    blocks) computes the context blocks its anchors reach, full below its first anchor, and the
    one key block of its own blocks; not the whole key range."""
    positions = torch.arange(16)[None] * 40 + 3  # anchors 3, 43, ..., 603: 8 per query row
    visible = BlockVisibility(positions.repeat_interleave(16, dim=1), 16)
    mask = visible.flex(700)
    first, last = positions[0, ::8], positions[0, 7::8]  # each row's anchors
    assert mask.full_kv_num_blocks[0, 0].tolist() == (first // BLOCK).tolist()
    partial_context = -(-last // BLOCK) - first // BLOCK
    assert mask.kv_num_blocks[0, 0].tolist() == (partial_context + 1).tolist()


def test_block_lists_are_each_rows_members_in_order():
    member = torch.tensor([[[False, True, False, True], [False] * 4, [True] * 4]])
    count, indices = block_lists(member)
    assert count.tolist() == [[[2, 0, 4]]]
    assert indices[0, 0, 0, :2].tolist() == [1, 3]
    assert indices[0, 0, 2].tolist() == [0, 1, 2, 3]
    assert count.dtype == indices.dtype == torch.int32


@pytest.mark.slow
def test_it_traces_with_dynamic_lengths():
    """Compiled with symbolic lengths (as the objective is after its second batch shape), the
    block lists equal the eager ones at lengths that add blocks."""
    torch._dynamo.reset()

    def lists(limit, context_length):
        return BlockVisibility(limit, 16).flex(context_length).as_tuple()[2:10]

    compiled = torch.compile(lists, dynamic=True, backend="aot_eager")
    for context_length, num_anchors in ((300, 20), (700, 40), (900, 30)):
        anchors = anchors_of(context_length, 16, num_anchors, seed=1)
        limit = block_visibility(anchors, 16).limit
        for got, want in zip(
            compiled(limit, context_length), lists(limit, context_length), strict=True
        ):
            assert torch.equal(got, want)


@pytest.mark.slow
def test_the_mask_captures_no_length_expression_under_dynamic_lengths():
    """Traced with symbolic lengths, what the element mask reads must be tensors or bare size
    symbols: inductor's flex lowering cannot realise a captured expression (a padded length),
    which fails a GPU's compile (ttt_mask.py's test says how it was found). The CPU has no
    compiled flex backward to show it, so this reads the traced graph of flex over the layout."""
    from torch.nn.attention.flex_attention import flex_attention

    def attention(q, k, limit, context_length):
        visible = BlockVisibility(limit, 16)
        keys = visible.pad_context(k, context_length)
        return flex_attention(q, keys, keys, block_mask=visible.flex(context_length))

    calls = []
    for context_length, num_anchors in ((300, 20), (700, 40)):
        limit = block_visibility(anchors_of(context_length, 16, num_anchors, seed=2), 16).limit
        queries = limit.shape[1]
        k = torch.randn(2, 1, context_length + queries, 16)
        calls.append((torch.randn(2, 1, queries, 16), k, limit, context_length))
    assert_the_mask_captures_no_length_expression(attention, calls)
