"""The training-time-test block mask (`ttt_mask`) against the attention `attend` computes,
element by element: what the flex kernel attends to (every pair of a full block, the mask's
pairs in a partial block, nothing elsewhere) must be exactly the reference's allowed pairs.
(The CPU's flex attention ignores the block lists and evaluates the mask everywhere, so the
output comparison in test_flex_attention cannot see a wrong block list; this test does.)"""

from __future__ import annotations

import pytest
import torch

from stages.drafter.ttt_mask import BLOCK, padded_length, ttt_block_mask


def block_map(num: torch.Tensor, indices: torch.Tensor, columns: int) -> torch.Tensor:
    """[B, rows, columns] bool from a BlockMask's (count, index list) pair; checks each list is
    ascending without repeats."""
    batch, _, rows, _ = indices.shape
    out = torch.zeros(batch, rows, columns, dtype=torch.bool)
    for b in range(batch):
        for r in range(rows):
            listed = indices[b, 0, r, : int(num[b, 0, r])].tolist()
            assert listed == sorted(set(listed)), (b, r, listed)
            out[b, r, listed] = True
    return out


def reference_pairs(key_mask: torch.Tensor, chains: int) -> torch.Tensor:
    """[B, T, keys] bool: what `attend` lets query q see, in the padded key layout."""
    batch, length = key_mask.shape
    q = torch.arange(length)[:, None]
    k = torch.arange(padded_length(length))[None, :]
    own = (k == q).expand(batch, -1, -1)  # itself, and its entry of each chain
    prefix = own.clone()
    prefix[:, :, :length] |= (k[:, :length] <= q) & key_mask[:, None, :]
    return torch.cat([prefix] + [own] * chains, dim=2)


def kernel_pairs(mask, length: int) -> torch.Tensor:
    """[B, T, keys] bool: the pairs the flex kernel computes under `mask`."""
    keys = mask.seq_lengths[1]
    columns = keys // BLOCK
    partial = block_map(mask.kv_num_blocks, mask.kv_indices, columns)
    full = block_map(mask.full_kv_num_blocks, mask.full_kv_indices, columns)
    assert not (partial & full).any(), "a block listed both partial and full"
    batch = partial.shape[0]
    b, q, k = (
        torch.arange(batch)[:, None, None],
        torch.arange(length)[None, :, None],
        torch.arange(keys)[None, None, :],
    )

    def by_element(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.repeat_interleave(BLOCK, 1)[:, :length].repeat_interleave(BLOCK, 2)

    return by_element(full) | (by_element(partial) & mask.mask_mod(b, 0, q, k))


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
    mask = ttt_block_mask(key_mask, chains)
    rows, columns = mask.kv_indices.shape[2], mask.seq_lengths[1] // BLOCK
    for kv, q in [
        ((mask.kv_num_blocks, mask.kv_indices), (mask.q_num_blocks, mask.q_indices)),
        (
            (mask.full_kv_num_blocks, mask.full_kv_indices),
            (mask.full_q_num_blocks, mask.full_q_indices),
        ),
    ]:
        assert torch.equal(block_map(*q, rows).transpose(1, 2), block_map(*kv, columns))


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
    import sympy
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    captured = []

    def record(gm, inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "flex_attention" in str(node.target):
                captured.extend(arg.meta["example_value"] for arg in node.args[-1])
        return gm

    def attention(q, k, key_mask):
        pad = (0, 0, 0, padded_length(q.shape[2]) - q.shape[2])
        keys = F.pad(torch.stack([k, k], 2), pad).flatten(2, 3)
        return flex_attention(q, keys, keys, block_mask=ttt_block_mask(key_mask, 1))

    compiled = torch.compile(attention, dynamic=True, backend=record)
    for length in (200, 300):
        q, k = torch.randn(2, 1, 2, length, 16)
        compiled(q, k, MASKS["right padding"](length)[None])
    tensors = [v for v in captured if isinstance(v, torch.Tensor)]
    assert any(isinstance(size, torch.SymInt) for t in tensors for size in t.shape), (
        "the mask's tensors were not traced with symbolic lengths"
    )
    for value in captured:
        if isinstance(value, torch.SymInt):
            assert isinstance(value.node.expr, sympy.Symbol), f"the mask captures {value}"
