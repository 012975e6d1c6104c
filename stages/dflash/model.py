"""The DFlash draft model: a few non-causal decoder layers that fill a whole block of masked
positions in one forward, conditioned on hidden states of several target layers.

The forward is the one SGLang's DFLASH worker runs (srt/models/dflash.py `DFlashDraftModel` with
the context K/V that srt/speculative/dflash_worker_v2.py writes into the draft cache; the same in
0.5.14 to 0.5.23 for a checkpoint that switches none of the later releases' extras on):

    ctx = hidden_norm(fc(aux))                 aux: the target layers' states, concatenated
    x = embed([anchor, mask, ..., mask])       the target's embedding; block at positions p .. p+B-1
    for each layer:
        h = input_layernorm(x)
        q = rope(q_norm(q_proj(h)))            q_norm / k_norm per head, before the rotation
        k = rope(k_norm(k_proj([ctx ; h])))    context keys at their own positions 0 .. p-1
        v = v_proj([ctx ; h])
        x = x + o_proj(attention(q, k, v))     non-causal: each block position sees the whole
                                               context and the whole block
        x = x + mlp(post_attention_layernorm(x))
    logits = lm_head(norm(x))                  the target's LM head; block position j drafts
                                               token p + j (position 0 holds the known token)

The context keys and values come from the projected states as they are, without the layer's
input_layernorm (SGLang's `prepare_context_hidden_for_kv` returns them unchanged; only its Laguna
variant normalises them). The draft has no embedding and no LM head of its own: SGLang feeds the
target's embedding of the block and projects the hidden states through the target's LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..drafter.model import (
    MLP,
    LayerShape,
    Linear,
    Projections,
    RMSNorm,
    Rope,
    TargetFacts,
    _rope_problems,
    flex_attention_kernel,
    mirrored_config,
    rope_inv_freq,
    rope_magnitude,
    rotate,
)
from .block_mask import BlockVisibility
from .layers import default_target_layer_ids, layer_ids_from_hf_indices


@dataclass(frozen=True)
class DFlashConfig(LayerShape):
    """Shapes of the draft model (each of its layers mirrors a target layer) and what it drafts
    with.

    `target_layer_ids` are SGLang's ids (layer k's output, HF hidden_states[k + 1]); the features
    fed to `fc` are those layers' states concatenated in this order. `mask_token_id` fills the
    block after its first token; `block_size` counts that first token.
    """

    num_hidden_layers: int
    target_hidden_size: int
    num_target_layers: int
    target_layer_ids: tuple[int, ...]
    block_size: int
    mask_token_id: int
    rope_scaling: dict | None = None
    hidden_act: str = "silu"

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        problems = self._shape_problems() + _rope_problems(self.rope_scaling)
        if problems:
            raise ValueError("DFlashConfig: " + "; ".join(problems))

    def _shape_problems(self) -> list[str]:
        problems = []
        if self.hidden_size != self.target_hidden_size:
            problems.append(
                f"hidden_size {self.hidden_size} differs from target_hidden_size "
                f"{self.target_hidden_size}: SGLang feeds the target's embedding and sizes fc as "
                "len(target_layer_ids) * hidden_size, so the draft is as wide as its target"
            )
        if self.num_hidden_layers < 1:
            problems.append(f"num_hidden_layers {self.num_hidden_layers} must be at least 1")
        problems += self.head_problems()
        if self.block_size < 2:
            problems.append(f"block_size {self.block_size}: a block drafts block_size - 1 tokens")
        outside = [i for i in self.target_layer_ids if not 0 <= i < self.num_target_layers]
        if not self.target_layer_ids or outside:
            problems.append(
                f"target_layer_ids {list(self.target_layer_ids)} must be non-empty ids in "
                f"0..{self.num_target_layers - 1} (the target's layers)"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(
                f"mask_token_id {self.mask_token_id} is outside the target vocabulary "
                f"(0..{self.vocab_size - 1}); SGLang cannot grow the target's embedding"
            )
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r}: SGLang's DFlash MLP runs silu")
        return problems

    @property
    def hf_indices(self) -> tuple[int, ...]:
        """The HF hidden-state indices the features must hold, in fc's order."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        *,
        num_hidden_layers: int,
        block_size: int,
        mask_token_id: int,
        aux_hf_indices: list[int] | None = None,
        rope: str = "mirror",
        **overrides,
    ) -> DFlashConfig:
        """Draft layers shaped like the target's (as EAGLE-3's `Eagle3Config.from_target`: an
        MLA target gets v_head_dim-wide heads, one key/value head per query head).

        aux_hf_indices: the HF hidden-state indices of the stored features (e.g. the EAGLE-3
        capture's [2, N // 2, N - 3]); None: SGLang's default ids for this many draft layers.
        rope="mirror" keeps the target's rope scaling, "plain" drops it (rope_theta stays).
        Overrides may raise max_position_embeddings, never lower it below the target's.
        """

        def dflash_fields(t: TargetFacts) -> dict[str, Any]:
            ids = (
                default_target_layer_ids(t.num_hidden_layers, num_hidden_layers)
                if aux_hf_indices is None
                else layer_ids_from_hf_indices(list(aux_hf_indices))
            )
            return dict(
                num_hidden_layers=num_hidden_layers,
                num_target_layers=t.num_hidden_layers,
                target_layer_ids=tuple(ids),
                block_size=block_size,
                mask_token_id=mask_token_id,
            )

        return mirrored_config(cls, target_config, rope, dflash_fields, overrides)


class Positions(NamedTuple):
    """Rotary positions of the keys' two parts: the context [S] and the block [B, Q]."""

    context: Tensor
    block: Tensor


def rotate_rows(x: Tensor, positions: Tensor, rope: Rope) -> Tensor:
    """`rotate` [B, heads, L, d] with positions per batch row [B, L] (blocks sit at each row's
    own anchors)."""
    return torch.cat([rotate(x[b : b + 1], positions[b], rope) for b in range(x.shape[0])])


class BlockAttention(Projections):
    """Attention of the block's positions over [context ; block] keys and values."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__(cfg, cfg.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    def _split(self, x: Tensor, heads: int) -> Tensor:
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        positions: Positions,
        visible: BlockVisibility | None,
        rope: Rope,
    ) -> Tensor:
        B, Q, _ = x.shape
        S = context.shape[1]
        keys_in = torch.cat([context, x], dim=1)
        key_positions = torch.cat([positions.context.expand(B, -1), positions.block], dim=1)
        q = rotate_rows(self.q_norm(self._split(self.q_proj(x), self.heads)), positions.block, rope)
        k = self.k_norm(self._split(self.k_proj(keys_in), self.kv_heads))
        k = rotate_rows(k, key_positions, rope)
        v = self._split(self.v_proj(keys_in), self.kv_heads)
        if visible is None:  # serving: the block sees the whole context and itself
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
        elif self.flex_chosen(x.is_cuda):  # a masked forward: flex with the blocks' mask
            k, v = (visible.pad_context(t, S) for t in (k, v))
            attend = flex_attention_kernel(q.is_cuda)
            out = attend(q, k, v, block_mask=visible.flex(S), enable_gqa=True)
        else:  # a mask and grouped heads together: SDPA's unfused math path on a GPU (every
            # score in float32); with the heads repeated, its fused masked kernel
            k, v = (t.repeat_interleave(self.heads // self.kv_heads, dim=1) for t in (k, v))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible.dense(S)[:, None])
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1))


class DFlashLayer(nn.Module):
    """One pre-norm decoder layer (`layers.<i>` in the exported weights)."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        positions: Positions,
        visible: BlockVisibility | None,
        rope: Rope,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, positions, visible, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The draft model. Parameter names are the exported checkpoint's key names."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        self.cfg = cfg
        features = len(cfg.target_layer_ids) * cfg.target_hidden_size
        self.fc = Linear(features, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # Not a buffer: casting the model to bf16 must not round the rotary frequencies.
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.rope_magnitude = rope_magnitude(cfg.rope_scaling)

    def forward(
        self,
        block_embeds: Tensor,
        block_positions: Tensor,
        aux: Tensor,
        visible: BlockVisibility | None = None,
    ) -> Tensor:
        """Hidden states [B, Q, hidden] after the final norm: the target LM head's input.

        block_embeds [B, Q, hidden]: the target's embedding of the block tokens;
        block_positions [B, Q]: their rotary positions; aux [B, S, num_features * hidden]: the
        target features of context positions 0 .. S - 1; visible: which [context ; block] keys each
        query may see (training's many blocks). None: all of them, as at serving time, where the
        context is exactly the committed prefix and the block one block.
        """
        context = self.hidden_norm(self.fc(aux))
        positions = Positions(torch.arange(aux.shape[1], device=aux.device), block_positions)
        rope = Rope(self.inv_freq.to(aux.device), self.rope_magnitude)
        x = block_embeds
        for layer in self.layers:
            x = layer(x, context, positions, visible, rope)
        return self.norm(x)
