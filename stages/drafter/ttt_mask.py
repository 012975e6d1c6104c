"""The flex-attention block mask of the training-time test, written down from its pattern.

Layout of the keys (`attend_flex`): the prefix, then one segment per chain step, each padded to a
whole number of BLOCK-row blocks, so that block j of every segment covers the same positions:

    [prefix: blocks 0..n-1 | chain 1: blocks n..2n-1 | ... | chain C: blocks Cn..(C+1)n-1]

Query block i (queries are the prefix positions) sees prefix blocks 0..i and block i of each
chain segment, nothing else. `create_block_mask` would find that by evaluating the mask at every
(query, key) pair and sorting each block row; traced inside the compiled objective, compiling
those sort kernels, one per TTT step, bounded the compile time (docs/performance.md).
Here the block lists are arithmetic on block numbers: no dense mask, no sort.

Prefix blocks before the diagonal are *full* (the kernel skips the mask there) while every key in
them is unpadded: blocks 0..L-1, L the count of leading blocks without padding. The diagonal
block, chain blocks and anything after padding began are *partial* (the mask decides each pair).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

BLOCK = 128  # flex attention's default sparse block size: the tile its kernels skip or compute


def padded_length(length: int) -> int:
    """`length` rounded up to whole blocks: the span of one segment of the key layout."""
    return -(-length // BLOCK) * BLOCK


def visible_fn(key_mask: Tensor, chains: int) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The element mask of the layout: query q sees prefix key k <= q when k is not padding
    (and itself always, as `attend` does), and entry q of every chain segment.

    The mask reads lookup tensors only, never a captured length: traced with dynamic lengths, a
    captured integer is symbolic, and inductor's flex lowering cannot take it as a mask input
    (torch 2.11 on a GPU: `'ShapeAsConstantBuffer' object has no attribute 'dtype'`)."""
    length = key_mask.shape[1]
    span = padded_length(length)
    slots = torch.arange((1 + chains) * span, device=key_mask.device)
    position = slots % span  # a key's position within its segment
    # [B, keys]: an unpadded prefix key (False for chain keys and for the padding past the prefix)
    open_prefix = F.pad(key_mask.bool(), (0, len(slots) - length))

    def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        key = position[kv_idx]
        return (key == q_idx) | ((key <= q_idx) & open_prefix[b, kv_idx])

    return visible


def ttt_block_mask(key_mask: Tensor, chains: int):
    """BlockMask over queries = the prefix positions and keys = prefix + `chains` segments in
    the padded layout above; key_mask [B, T] bool marks the unpadded prefix positions."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, length = key_mask.shape
    n = padded_length(length) // BLOCK  # blocks per segment (and query blocks)
    total = (1 + chains) * n
    device = key_mask.device
    whole = F.pad(key_mask.bool(), (0, n * BLOCK - length)).view(batch, n, BLOCK).all(-1)
    # the count of leading whole blocks: the index of the first block that is not (a sentinel
    # not-whole block ends every row)
    leading = F.pad(~whole, (0, 1), value=True).int().argmax(-1, keepdim=True)  # [B, 1]

    rows = torch.arange(n, device=device)  # query blocks
    full_rows = torch.minimum(rows, leading)  # [B, n]: full blocks 0..full_rows-1
    prefix_partial = rows + 1 - full_rows  # then partial prefix blocks full_rows..i
    slot = torch.arange(total, device=device)
    chain = slot - prefix_partial[..., None]  # [B, n, total]: chain segment of a slot, from 0
    prefix_block = full_rows[..., None] + slot
    kv_indices = torch.where(chain < 0, prefix_block, (chain + 1) * n + rows[:, None])
    kv_num = prefix_partial + chains
    kv_indices = torch.where(slot < kv_num[..., None], kv_indices, 0)
    full_kv_indices = torch.where(slot < full_rows[..., None], slot, 0)

    # the transpose: for kv block j, the query blocks that see it
    in_prefix = slot < n
    whole_col = slot[None] < leading  # [B, total]: a prefix block before padding
    # partial: a whole prefix block j from query block j only, a later one from j..n-1, a chain
    # block from its own query block
    q_num = torch.where(in_prefix & ~whole_col, n - slot, 1)
    q_indices = torch.where(rows < q_num[..., None], (slot % n)[:, None] + rows, 0)
    full_q_num = torch.where(whole_col, n - 1 - slot, 0)  # a whole block j: full for j+1..n-1
    full_q_indices = torch.where(rows < full_q_num[..., None], slot[:, None] + 1 + rows, 0)

    def blocks(t: Tensor) -> Tensor:
        return t.unsqueeze(1).to(torch.int32)  # one head dimension, shared by all heads

    return BlockMask(
        seq_lengths=(length, total * BLOCK),
        kv_num_blocks=blocks(kv_num),
        kv_indices=blocks(kv_indices),
        full_kv_num_blocks=blocks(full_rows),
        full_kv_indices=blocks(full_kv_indices),
        q_num_blocks=blocks(q_num),
        q_indices=blocks(q_indices),
        full_q_num_blocks=blocks(full_q_num),
        full_q_indices=blocks(full_q_indices),
        BLOCK_SIZE=(BLOCK, BLOCK),
        mask_mod=visible_fn(key_mask, chains),
    )
