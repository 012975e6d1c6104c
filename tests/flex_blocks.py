"""What a flex-attention BlockMask makes the kernel compute, pair by pair: the tests of both
drafter families' block masks compare it with their reference masks."""

from __future__ import annotations

import torch

from stages.drafter.ttt_mask import BLOCK


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


def kernel_pairs(mask, length: int) -> torch.Tensor:
    """[B, length, keys] bool: the pairs the flex kernel computes under `mask` (`length`
    queries; the last blocks of queries and keys may be partly past the ends)."""
    keys = mask.seq_lengths[1]
    columns = -(-keys // BLOCK)
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
        rows = blocks.repeat_interleave(BLOCK, 1)[:, :length]
        return rows.repeat_interleave(BLOCK, 2)[..., :keys]

    return by_element(full) | (by_element(partial) & mask.mask_mod(b, 0, q, k))


def assert_query_lists_are_the_transpose(mask) -> None:
    """The backward pass's lists (key block -> query blocks) must be the forward's transposed,
    for the partial and for the full blocks."""
    rows, columns = mask.kv_indices.shape[2], mask.kv_indices.shape[3]
    for kv, q in [
        ((mask.kv_num_blocks, mask.kv_indices), (mask.q_num_blocks, mask.q_indices)),
        (
            (mask.full_kv_num_blocks, mask.full_kv_indices),
            (mask.full_q_num_blocks, mask.full_q_indices),
        ),
    ]:
        assert torch.equal(block_map(*q, rows).transpose(1, 2), block_map(*kv, columns))


def assert_the_mask_captures_no_length_expression(attention, calls) -> None:
    """Compile `attention` (a function calling flex_attention with a block mask) with dynamic
    shapes, call it with each argument tuple of `calls`, and check what its element mask reads:
    tensors traced with symbolic lengths, or bare size symbols, never an expression of them (a
    padded length, `length - 1`), which inductor's flex lowering cannot realise on a GPU."""
    import sympy

    torch._dynamo.reset()
    captured = []

    def record(gm, inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "flex_attention" in str(node.target):
                captured.extend(arg.meta["example_value"] for arg in node.args[-1])
        return gm

    compiled = torch.compile(attention, dynamic=True, backend=record)
    for args in calls:
        compiled(*args)
    tensors = [v for v in captured if isinstance(v, torch.Tensor)]
    assert any(isinstance(size, torch.SymInt) for t in tensors for size in t.shape), (
        "the mask's tensors were not traced with symbolic lengths"
    )
    for value in captured:
        if isinstance(value, torch.SymInt):
            assert isinstance(value.node.expr, sympy.Symbol), f"the mask captures {value}"
