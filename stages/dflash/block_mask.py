"""Which keys a training block sees, in the two forms the attention takes: a dense mask for SDPA
and flex attention's block mask, which lets a GPU skip what no query sees.

The keys are [context ; blocks]. Query q, of block n = q // block_size, sees the context positions
before its block's anchor (none for a padding block) and the keys of its own block, both ways
(objective.py). Dense, that is a [B, Q, S + Q] bool mask: at dflash's defaults (512 blocks of 16
over 2,048 positions) 8,192 x 10,240 pairs per sample, of which each query sees at most 2,048.

For flex the context is padded to whole BLOCK-row blocks, so that the blocks' keys line up with
the queries:

    [context: key blocks 0..c-1 | the blocks' keys: key blocks c..c+n-1]

Query block i (BLOCK queries) computes the context blocks before its last anchor, *full* (the
kernel skips the mask) below its first anchor, and the key blocks its own blocks' keys cover
(one when block_size divides BLOCK); nothing else. The block lists are arithmetic on block
numbers, compacted without a sort, so a compiled objective traces them as a few small kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..drafter.ttt_mask import BLOCK, padded_length


@dataclass
class BlockVisibility:
    """What each query of a batch's blocks may attend to, [context ; blocks] keys."""

    limit: Tensor  # [B, Q] int64: query q sees context positions < limit[b, q]
    block_size: int

    def dense(self, context_length: int) -> Tensor:
        """[B, Q, S + Q] bool over the unpadded keys."""
        Q = self.limit.shape[1]
        device = self.limit.device
        context = torch.arange(context_length, device=device)[None, None] < self.limit[..., None]
        block = torch.arange(Q, device=device) // self.block_size
        own_block = block[:, None] == block[None, :]
        return torch.cat([context, own_block.expand(len(self.limit), -1, -1)], dim=2)

    def flex(self, context_length: int):
        """The BlockMask of the padded layout (module docstring): queries [B, Q] over keys
        padded_length(S) + Q."""
        from torch.nn.attention.flex_attention import BlockMask

        B, Q = self.limit.shape
        device = self.limit.device
        c = padded_length(context_length) // BLOCK
        n = padded_length(Q) // BLOCK
        # each query block's smallest and largest anchor, over its real queries
        rows = F.pad(self.limit, (0, n * BLOCK - Q), value=-1).view(B, n, BLOCK)
        last = rows.amax(-1)
        first = rows.masked_fill(rows < 0, context_length).amin(-1)
        start = torch.arange(c, device=device) * BLOCK  # [c] each context block's first key
        seen = start < last[..., None]  # [B, n, c]
        full = start + BLOCK <= first[..., None]
        # the blocks' keys: query block i covers the keys of the blocks its queries belong to
        i = torch.arange(n, device=device)
        bs = self.block_size
        first_key = (i * BLOCK // bs) * bs
        last_key = ((torch.clamp((i + 1) * BLOCK, max=Q) - 1) // bs + 1) * bs - 1
        j = i * BLOCK  # each key block's first key
        own = (j[None] <= last_key[:, None]) & (j[None] + BLOCK > first_key[:, None])  # [n, n]
        partial = torch.cat([seen & ~full, own.expand(B, -1, -1)], dim=2)  # [B, n, c + n]
        full = torch.cat([full, torch.zeros_like(partial[..., c:])], dim=2)
        kv_num, kv_indices = block_lists(partial)
        full_kv_num, full_kv_indices = block_lists(full)
        q_num, q_indices = block_lists(partial.transpose(1, 2))
        full_q_num, full_q_indices = block_lists(full.transpose(1, 2))
        return BlockMask(
            seq_lengths=(Q, c * BLOCK + Q),
            kv_num_blocks=kv_num,
            kv_indices=kv_indices,
            full_kv_num_blocks=full_kv_num,
            full_kv_indices=full_kv_indices,
            q_num_blocks=q_num,
            q_indices=q_indices,
            full_q_num_blocks=full_q_num,
            full_q_indices=full_q_indices,
            BLOCK_SIZE=(BLOCK, BLOCK),
            mask_mod=self._visible(c, n),
        )

    def _visible(self, c: int, n: int) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
        """The element mask of the padded layout. It reads lookup tensors, never a captured
        length (a symbolic one fails inductor's flex lowering; ttt_mask.py says how), each padded
        to whole blocks, since the kernel evaluates whole tiles."""
        device = self.limit.device
        key = torch.arange((c + n) * BLOCK, device=device)
        in_context = key < c * BLOCK
        # a key's context position (past every limit for the blocks' keys) and its block (-1 for
        # the context's)
        context_position = torch.where(in_context, key, (c + n) * BLOCK)
        key_block = torch.where(in_context, -1, (key - c * BLOCK) // self.block_size)
        query_block = torch.arange(n * BLOCK, device=device) // self.block_size
        limit = F.pad(self.limit, (0, n * BLOCK - self.limit.shape[1]))

        def visible(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return (context_position[kv_idx] < limit[b, q_idx]) | (
                key_block[kv_idx] == query_block[q_idx]
            )

        return visible

    @staticmethod
    def pad_context(keys: Tensor, context_length: int) -> Tensor:
        """[B, heads, S + Q, d] keys or values in the flex layout: zero rows after the context
        up to whole blocks (no query sees them)."""
        context, blocks = keys.split([context_length, keys.shape[2] - context_length], dim=2)
        return torch.cat(
            [F.pad(context, (0, 0, 0, padded_length(context_length) - context_length)), blocks], 2
        )


def block_lists(member: Tensor) -> tuple[Tensor, Tensor]:
    """[B, R, C] bool -> (count [B, 1, R], indices [B, 1, R, C]) int32: each row's member
    columns, ascending, in its first places; a BlockMask's lists (one head dimension, shared by
    every head). Compacted by a running count and a scatter, not a sort."""
    B, R, C = member.shape
    slot = torch.where(member, member.cumsum(-1) - 1, C)  # non-members go to a spare place
    columns = torch.arange(C, device=member.device).expand(B, R, C)
    indices = member.new_zeros(B, R, C + 1, dtype=torch.int64).scatter_(-1, slot, columns)
    return member.sum(-1, dtype=torch.int32)[:, None], indices[:, None, :, :C].to(torch.int32)
