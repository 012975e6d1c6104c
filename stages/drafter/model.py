"""The EAGLE-3 draft model: one Llama decoder layer over [token embedding ; target features].

Everything the serving engines run is here, in plain torch, so training and speculative decoding
share one forward (`Eagle3Drafter.step`) and cannot drift apart. The semantics are SGLang's
`LlamaForCausalLMEagle3` (REFERENCE.md section 3):

    h = fc(aux)                      only when the incoming hidden state is num_aux * target wide
    residual = h
    x = cat([input_layernorm(embed), hidden_norm(h)])
    residual = self_attn(x) + residual
    out = mlp(post_attention_layernorm(residual)) + residual
    logits = lm_head(norm(out))      over the draft vocabulary; `out` feeds the next draft step

Attention layout (the training-time test must see exactly what serving sees): the first step runs
over a prefix of T positions with causal attention; its keys/values are the prefix cache. Each
later step k runs at rope position i + k for a query at prefix position i and attends to the
prefix keys 0..i plus the keys of steps 1..k at that same position i (its own chain).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class TargetFacts:
    """The shapes of a target model the drafter depends on, read from its Hugging Face config."""
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int


def target_facts(target_config: Any) -> TargetFacts:
    """Read a target's config (a transformers config or its config.json as a dict).

    Handles multimodal wrappers (`text_config`) and both rope layouts: transformers 5
    `rope_parameters` and the older `rope_theta` + `rope_scaling`.
    """
    arch = (_get(target_config, "architectures", None) or ["unknown"])[0]
    text = _get(target_config, "text_config", None) or target_config

    def need(key: str):
        value = _get(text, key, None)
        if value is None:
            raise ValueError(f"target config: `{key}` is missing; the draft layer copies the "
                             f"target's shapes from it")
        return value

    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    theta, scaling = rope_fields(text)
    return TargetFacts(
        architecture=arch,
        num_hidden_layers=int(need("num_hidden_layers")),
        hidden_size=hidden,
        vocab_size=int(need("vocab_size")),
        num_attention_heads=heads,
        num_key_value_heads=int(_get(text, "num_key_value_heads", None) or heads),
        head_dim=int(_get(text, "head_dim", None) or hidden // heads),
        intermediate_size=int(need("intermediate_size")),
        rms_norm_eps=float(_get(text, "rms_norm_eps", None) or 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(need("max_position_embeddings")),
    )


def _get(config: Any, key: str, default):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def rope_fields(config: Any) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None for plain RoPE), with `rope_type` as the scaling's key."""
    params = _get(config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        theta = params["rope_theta"]
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta, scaling = _get(config, "rope_theta", None), _get(config, "rope_scaling", None)
        scaling = dict(scaling) if scaling else None
    if theta is None:
        raise ValueError("target config: no `rope_theta` (nor `rope_parameters.rope_theta`)")
    if scaling is not None:
        legacy_type = scaling.pop("type", None)
        rope_type = scaling.pop("rope_type", None) or legacy_type or "default"
        scaling = {"rope_type": rope_type, **scaling} if rope_type != "default" else None
    return float(theta), scaling


@dataclass(frozen=True)
class Eagle3Config:
    """Shapes of the draft model; `aux_layer_ids` are the HF `hidden_states` indices trained on."""
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    rope_scaling: dict | None = None
    num_aux: int = 3
    hidden_act: str = "silu"

    def __post_init__(self):
        object.__setattr__(self, "aux_layer_ids", tuple(int(i) for i in self.aux_layer_ids))
        problems = []
        if len(self.aux_layer_ids) != self.num_aux:
            problems.append(f"aux_layer_ids {list(self.aux_layer_ids)} must hold num_aux="
                            f"{self.num_aux} indices")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_attention_heads {self.num_attention_heads} is not a multiple "
                            f"of num_key_value_heads {self.num_key_value_heads}")
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            problems.append(f"draft_vocab_size {self.draft_vocab_size} must be in "
                            f"1..vocab_size ({self.vocab_size})")
        if self.num_aux * self.target_hidden_size == self.hidden_size:
            problems.append("num_aux * target_hidden_size equals hidden_size: the first step "
                            "(fc) could not be told from a chain step by width")
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r}: the serving engines only run silu")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in SUPPORTED_ROPE_TYPES:
            problems.append(f"rope_scaling type {rope_type!r} is not implemented here "
                            f"({', '.join(SUPPORTED_ROPE_TYPES)}); pass rope_scaling=None to "
                            f"train the draft layer with plain RoPE")
        if problems:
            raise ValueError("Eagle3Config: " + "; ".join(problems))

    @classmethod
    def from_target(cls, target_config: Any, draft_vocab_size: int,
                    aux_hf_indices: list[int], **overrides) -> "Eagle3Config":
        """Mirror a target layer (the draft layer is one more layer of the target's kind)."""
        t = target_facts(target_config)
        values = dict(
            hidden_size=t.hidden_size, num_attention_heads=t.num_attention_heads,
            num_key_value_heads=t.num_key_value_heads, head_dim=t.head_dim,
            intermediate_size=t.intermediate_size, rms_norm_eps=t.rms_norm_eps,
            rope_theta=t.rope_theta, rope_scaling=t.rope_scaling,
            max_position_embeddings=t.max_position_embeddings, vocab_size=t.vocab_size,
            draft_vocab_size=draft_vocab_size, target_hidden_size=t.hidden_size,
            aux_layer_ids=tuple(aux_hf_indices), num_aux=len(aux_hf_indices),
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"Eagle3Config.from_target: unknown overrides {sorted(unknown)}")
        values.update(overrides)
        return cls(**values)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> Tensor:
    """Inverse frequencies of rotary embeddings, with the Llama scaling variants."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif rope_type == "llama3":
        factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return inv_freq


def apply_rope(x: Tensor, positions: Tensor, inv_freq: Tensor) -> Tensor:
    """Rotate [B, heads, Q, head_dim] by the angles of `positions` [Q] (rotate-half layout)."""
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


@dataclass
class DraftKV:
    """Keys/values the draft layer attends to: the prefix (first step) and each query's chain.

    `query_index[q]` is the prefix position of query q; `chain_k[j]` holds the keys of chain step
    j + 1 for every query, so chain attention is a per-query dot product, never a T x T mask.
    """
    prefix_k: Tensor              # [B, kv_heads, T, head_dim]
    prefix_v: Tensor
    key_mask: Tensor              # [B, T] bool: prefix positions that may be attended
    query_index: Tensor           # [Q] int64
    chain_k: list[Tensor] = field(default_factory=list)   # each [B, kv_heads, Q, head_dim]
    chain_v: list[Tensor] = field(default_factory=list)

    @property
    def chain_length(self) -> int:
        return len(self.chain_k)

    def with_chain(self, k: Tensor, v: Tensor) -> "DraftKV":
        return DraftKV(self.prefix_k, self.prefix_v, self.key_mask, self.query_index,
                       self.chain_k + [k], self.chain_v + [v])

    def select_queries(self, index: Tensor) -> "DraftKV":
        """Keep only the queries at `index` (e.g. the last prefix position for decoding)."""
        return DraftKV(self.prefix_k, self.prefix_v, self.key_mask, self.query_index[index],
                       [k[:, :, index] for k in self.chain_k],
                       [v[:, :, index] for v in self.chain_v])


class Attention(nn.Module):
    """Llama attention whose q/k/v read the 2 * hidden wide [embedding ; hidden] input."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (cfg.num_attention_heads,
                                                    cfg.num_key_value_heads, cfg.head_dim)
        self.q_proj = nn.Linear(2 * cfg.hidden_size, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, inv_freq: Tensor, kv: DraftKV | None,
                key_mask: Tensor | None) -> tuple[Tensor, DraftKV]:
        B, Q, _ = x.shape
        q = self.q_proj(x).view(B, Q, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, Q, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, Q, self.kv_heads, self.head_dim).transpose(1, 2)
        if kv is None:  # first step: these positions are the prefix
            positions = torch.arange(Q, device=x.device)
            if key_mask is None:
                key_mask = torch.ones(B, Q, dtype=torch.bool, device=x.device)
            k = apply_rope(k, positions, inv_freq)
            kv = DraftKV(k, v, key_mask.bool(), positions)
        else:  # chain step: every query extends its own chain by one position
            if Q != kv.query_index.numel():
                raise ValueError(f"chain step got {Q} queries, the cache tracks "
                                 f"{kv.query_index.numel()}")
            positions = kv.query_index + kv.chain_length + 1
            kv = kv.with_chain(apply_rope(k, positions, inv_freq), v)
        q = apply_rope(q, positions, inv_freq)
        out = attend(q, kv)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1)), kv


def attend(q: Tensor, kv: DraftKV) -> Tensor:
    """Softmax attention of q [B, heads, Q, d] over the causal prefix plus each query's chain."""
    B, H, Q, d = q.shape
    kv_heads, T = kv.prefix_k.shape[1], kv.prefix_k.shape[2]
    qg = q.view(B, kv_heads, H // kv_heads, Q, d)
    scale = d ** -0.5
    scores = torch.einsum("bhgqd,bhtd->bhgqt", qg, kv.prefix_k) * scale
    keys = torch.arange(T, device=q.device)
    causal = keys[None, :] <= kv.query_index[:, None]                        # [Q, T]
    allowed = (causal[None] & kv.key_mask[:, None, :]) | (keys[None, :] == kv.query_index[:, None])
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    if kv.chain_k:
        chain_k = torch.stack(kv.chain_k, dim=-2)                             # [B, kvh, Q, C, d]
        chain_scores = torch.einsum("bhgqd,bhqcd->bhgqc", qg, chain_k) * scale
        scores = torch.cat([scores, chain_scores], dim=-1)
    probs = scores.float().softmax(dim=-1).to(q.dtype)
    out = torch.einsum("bhgqt,bhtd->bhgqd", probs[..., :T], kv.prefix_v)
    if kv.chain_v:
        chain_v = torch.stack(kv.chain_v, dim=-2)
        out = out + torch.einsum("bhgqc,bhqcd->bhgqd", probs[..., T:], chain_v)
    return out.reshape(B, H, Q, d)


class MLP(nn.Module):
    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """The draft's single decoder layer (`midlayer` in the exported weights)."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embeds: Tensor, hidden: Tensor, inv_freq: Tensor, kv: DraftKV | None,
                key_mask: Tensor | None) -> tuple[Tensor, DraftKV]:
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x, kv = self.self_attn(x, inv_freq, kv, key_mask)
        residual = x + residual
        out = self.mlp(self.post_attention_layernorm(residual)) + residual
        return out, kv


class DraftStep(NamedTuple):
    logits: Tensor   # [B, Q, draft_vocab]
    out: Tensor      # [B, Q, hidden], before the final norm: the next step's hidden state
    kv: DraftKV


class Eagle3Drafter(nn.Module):
    """The draft model. Parameter and buffer names are the exported checkpoint's key names."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # Until set_vocab: the first draft_vocab_size target ids.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[: cfg.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        # Not a buffer: casting the model to bf16 must not round the rotary frequencies.
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)

    def set_vocab(self, d2t: Tensor, t2d: Tensor) -> None:
        """Install the draft vocabulary mapping (target_id = i + d2t[i]; t2d marks kept ids)."""
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(f"set_vocab: d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not "
                             f"fit draft_vocab_size {self.cfg.draft_vocab_size} / vocab_size "
                             f"{self.cfg.vocab_size}")
        if not torch.equal(t2d.bool().nonzero().flatten().cpu(), self.draft_ids(d2t).cpu()):
            raise ValueError("set_vocab: t2d does not mark exactly the ids i + d2t[i] (ascending)")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_ids(self, d2t: Tensor | None = None) -> Tensor:
        """Target id of each draft-vocabulary index."""
        d2t = self.d2t if d2t is None else d2t
        return torch.arange(d2t.numel(), device=d2t.device) + d2t

    def step(self, embeds: Tensor, hidden: Tensor, kv: DraftKV | None = None,
             key_mask: Tensor | None = None) -> DraftStep:
        """One draft step, shared by training and decoding.

        embeds: [B, Q, hidden] embeddings of the tokens this step reads.
        hidden: [B, Q, num_aux * target_hidden] target features (first step, runs `fc`) or the
            previous step's `out` [B, Q, hidden] (chain step).
        kv: None for the first step (its Q positions become the prefix, attended causally, with
            `key_mask` [B, Q] hiding padding), else the cache returned by the previous step.
        """
        if hidden.shape[-1] != self.cfg.hidden_size:
            hidden = self.fc(hidden)
        inv_freq = self.inv_freq.to(embeds.device)
        out, kv = self.midlayer(embeds, hidden, inv_freq, kv, key_mask)
        return DraftStep(self.lm_head(self.norm(out)), out, kv)


def embed_tokens(embed: nn.Embedding | Tensor, ids: Tensor) -> Tensor:
    """Look up the target's (frozen) token embedding, given as a module or its weight."""
    if isinstance(embed, nn.Embedding):
        return embed(ids)
    return F.embedding(ids, embed)
