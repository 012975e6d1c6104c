"""The EAGLE-3 draft model: one Llama decoder layer over [token embedding ; target features].

Everything the serving engines run is here, in plain torch, so training and speculative decoding
share one forward (`Eagle3Drafter.step`) and cannot drift apart. The semantics are SGLang's
`LlamaForCausalLMEagle3` (docs/serving.md, section 3):

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
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fp8 import fp8_linear
from .ttt_mask import padded_length, ttt_block_mask

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
ROPE_REQUIRED_KEYS = {  # what each scaling type needs (the engines' fallbacks are guesses)
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
}
ROPE_CHOICES = ("mirror", "plain")
# Fields only multi-head latent attention (DeepSeek-V2/V3, Kimi-K2/K2.5) configs carry.
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim")


@dataclass(frozen=True)
class TargetFacts:
    """The shapes of a target model the drafter depends on, read from its Hugging Face config.

    `head_dim` and `num_key_value_heads` are those of a Llama attention standing in for the
    target's own: the target's for Llama-like targets, derived for MLA ones (`attention_shape`).
    """

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
    heads = int(_require(text, "num_attention_heads"))
    head_dim, kv_heads = attention_shape(text, heads)
    theta, scaling = rope_fields(text)
    return TargetFacts(
        architecture=arch,
        num_hidden_layers=int(_require(text, "num_hidden_layers")),
        hidden_size=int(_require(text, "hidden_size")),
        vocab_size=int(_require(text, "vocab_size")),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(_require(text, "intermediate_size")),
        rms_norm_eps=float(_get(text, "rms_norm_eps", None) or 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(_require(text, "max_position_embeddings")),
    )


def attention_shape(text_config: Any, heads: int) -> tuple[int, int]:
    """(head_dim, num_key_value_heads) of the draft's Llama attention for this target.

    A multi-head latent attention target (any of MLA_FIELDS set) has no Llama head to copy: its
    `head_dim`, where a config object sets one, is the 64-wide rotary slice, its keys are
    qk_nope + qk_rope = 192 wide, and hidden // heads (7168 // 64 = 112) matches nothing. The draft
    takes the width of one MLA value head (`v_head_dim`, 128 in DeepSeek-V3 and Kimi-K2.5, the
    head_dim of the published Kimi drafters) and, as MLA has no grouped keys, one key/value head
    per query head. The dense `intermediate_size` these configs carry stays the MLP width.
    """
    if any(_get(text_config, key, None) is not None for key in MLA_FIELDS):
        return int(_require(text_config, "v_head_dim")), heads
    hidden = int(_require(text_config, "hidden_size"))
    return (
        int(_get(text_config, "head_dim", None) or hidden // heads),
        int(_get(text_config, "num_key_value_heads", None) or heads),
    )


def _require(config: Any, key: str):
    value = _get(config, key, None)
    if value is None:
        raise ValueError(
            f"target config: `{key}` is missing; the draft layer copies the target's shapes from it"
        )
    return value


def _get(config: Any, key: str, default):
    if isinstance(config, dict):
        return config.get(key, default)
    return getattr(config, key, default)


def rope_fields(config: Any) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None for plain RoPE), with `rope_type` as the scaling's key."""
    params = _get(config, "rope_parameters", None)
    scaling: dict | None
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
class LayerShape:
    """A draft layer's shapes, mirrored from a target layer (`mirrored_config`): the fields both
    drafter families' configs start with."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int

    def head_problems(self) -> list[str]:
        """Grouped-query attention needs whole groups of query heads per key/value head."""
        if self.num_attention_heads % self.num_key_value_heads:
            return [
                f"num_attention_heads {self.num_attention_heads} is not a multiple "
                f"of num_key_value_heads {self.num_key_value_heads}"
            ]
        return []


@dataclass(frozen=True)
class Eagle3Config(LayerShape):
    """Shapes of the draft model; `aux_layer_ids` are the HF `hidden_states` indices trained on."""

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
            problems.append(
                f"aux_layer_ids {list(self.aux_layer_ids)} must hold num_aux={self.num_aux} indices"
            )
        problems += self.head_problems()
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            problems.append(
                f"draft_vocab_size {self.draft_vocab_size} must be in "
                f"1..vocab_size ({self.vocab_size})"
            )
        if self.num_aux * self.target_hidden_size == self.hidden_size:
            problems.append(
                "num_aux * target_hidden_size equals hidden_size: the first step "
                "(fc) could not be told from a chain step by width"
            )
        if self.hidden_act != "silu":
            problems.append(f"hidden_act {self.hidden_act!r}: the serving engines only run silu")
        problems += _rope_problems(self.rope_scaling)
        if problems:
            raise ValueError("Eagle3Config: " + "; ".join(problems))

    @classmethod
    def from_target(
        cls,
        target_config: Any,
        draft_vocab_size: int,
        aux_hf_indices: list[int],
        rope: str = "mirror",
        **overrides,
    ) -> Eagle3Config:
        """Mirror a target layer (the draft layer is one more layer of the target's kind).

        rope="mirror" keeps the target's rope_theta and rope_scaling; rope="plain" keeps its
        rope_theta and drops the scaling (plain RoPE, e.g. for a scaling type not implemented
        here). An explicit rope_theta override applies on top of either. Overrides may raise
        max_position_embeddings, never lower it below the target's.
        """
        return mirrored_config(
            cls,
            target_config,
            rope,
            lambda t: dict(
                draft_vocab_size=draft_vocab_size,
                aux_layer_ids=tuple(aux_hf_indices),
                num_aux=len(aux_hf_indices),
            ),
            overrides,
        )


DraftConfig = TypeVar("DraftConfig", bound=LayerShape)


def mirrored_config(
    cls: type[DraftConfig],
    target_config: Any,
    rope: str,
    family_fields: Callable[[TargetFacts], dict[str, Any]],
    overrides: dict[str, Any],
) -> DraftConfig:
    """`cls` (a draft config dataclass) whose layers mirror the target's, for both drafter
    families' `from_target`: the target's shapes and rope (rope="mirror"; "plain" drops the
    scaling), then `family_fields(target)`, then `overrides`, which may raise
    max_position_embeddings but never lower it below the target's."""
    name = f"{cls.__name__}.from_target"
    if rope not in ROPE_CHOICES:
        raise ValueError(
            f"{name}: rope={rope!r}; choose one of {', '.join(map(repr, ROPE_CHOICES))}"
        )
    if rope == "plain" and overrides.get("rope_scaling") is not None:
        raise ValueError(
            f"{name}: rope='plain' drops rope_scaling; pass rope='mirror' to set rope_scaling "
            "yourself"
        )
    unknown = set(overrides) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"{name}: unknown overrides {sorted(unknown)}")
    t = target_facts(target_config)
    values: dict[str, Any] = dict(
        hidden_size=t.hidden_size,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
        intermediate_size=t.intermediate_size,
        rms_norm_eps=t.rms_norm_eps,
        rope_theta=t.rope_theta,
        rope_scaling=t.rope_scaling if rope == "mirror" else None,
        max_position_embeddings=t.max_position_embeddings,
        vocab_size=t.vocab_size,
        target_hidden_size=t.hidden_size,
        **family_fields(t),
    )
    values.update(overrides)
    if values["max_position_embeddings"] < t.max_position_embeddings:
        raise ValueError(
            f"{name}: max_position_embeddings {values['max_position_embeddings']} is below the "
            f"target's {t.max_position_embeddings}; the engines size the draft's rotary table "
            "by it, so drafts past that position go wrong and acceptance drops on long "
            f"contexts. Drop the override or set it to at least {t.max_position_embeddings}"
        )
    return cls(**values)


def _rope_problems(scaling: dict | None) -> list[str]:
    params = scaling or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in SUPPORTED_ROPE_TYPES:
        return [
            f"rope_scaling type {rope_type!r} is not implemented here "
            f"({', '.join(SUPPORTED_ROPE_TYPES)}); use rope='plain' in from_target (or "
            f"rope_scaling=None) to train the draft layer with plain RoPE"
        ]
    return [
        f"rope_scaling ({rope_type}) has no `{key}`; add it (the target's config names it)"
        for key in ROPE_REQUIRED_KEYS.get(rope_type, ())
        if params.get(key) is None
    ]


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> Tensor:
    """Inverse frequencies of rotary embeddings (fp32), with the Llama scaling variants."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    params = scaling or {}
    rope_type = params.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / params["factor"]
    elif rope_type == "llama3":
        factor, old_len = params["factor"], params["original_max_position_embeddings"]
        low, high = params["low_freq_factor"], params["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = ((old_len / wavelen - low) / (high - low)).clamp(0, 1)
        inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    elif rope_type == "yarn":
        inv_freq = _yarn_inv_freq(head_dim, theta, params)
    return inv_freq


def _yarn_inv_freq(d: int, theta: float, scaling: dict) -> Tensor:
    """YaRN frequencies exactly as SGLang serves the draft (read in the SGLang 0.5.13 to 0.5.23
    wheels: models/llama.py `LlamaAttention` passes the config's rope_scaling to
    layers/rotary_embedding/factory.py `get_rope`; type "yarn" builds yarn.py
    `YaRNScalingRotaryEmbedding` over original_max_position_embeddings; "deepseek_yarn" is only
    what deepseek_v2.py forces on its own MLA layers).

    Keys read: factor, original_max_position_embeddings, beta_fast (32), beta_slow (1),
    extrapolation_factor (1), truncate (true); other keys do not move the frequencies. With
    d = head_dim, L = original_max_position_embeddings and f_i = theta ** (-2i / d):

        c(r) = d * ln(L / (2 pi r)) / (2 ln theta)      the pair that turns r times within L
        low = max(floor(c(beta_fast)), 0), high = min(ceil(c(beta_slow)), d - 1)
                                                        (no floor / ceil when truncate is false)
        keep_i = (1 - clamp((i - low) / (high - low), 0, 1)) * extrapolation_factor
        inv_freq_i = f_i / factor * (1 - keep_i) + f_i * keep_i

    so fast pairs keep their frequency and slow ones are interpolated by `factor`.
    """
    factor, length = scaling["factor"], scaling["original_max_position_embeddings"]

    def turning_pair(rotations: float) -> float:
        return d * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = turning_pair(scaling.get("beta_fast", 32))
    high = turning_pair(scaling.get("beta_slow", 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = (1 - ramp) * scaling.get("extrapolation_factor", 1)
    periods = theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # 1 / f_i
    return 1.0 / (factor * periods) * (1 - keep) + 1.0 / periods * keep


def _yarn_get_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_magnitude(scaling: dict | None) -> float:
    """What SGLang multiplies yarn's cos and sin by (its `mscale`; 1 for other rope types).

    With g(m) = 0.1 * m * ln(factor) + 1 (1 when factor <= 1), SGLang >= 0.5.16 (yarn.py
    `YaRNScalingRotaryEmbedding.__init__`) uses g(mscale) / g(mscale_all_dim) when both keys are
    given, else g(1), times attn_factor (default 1). q and k both carry it, so attention logits
    grow by its square; the softmax scale stays head_dim ** -0.5 (llama.py; only DeepSeek's MLA
    layers fold mscale_all_dim into theirs). SGLang <= 0.5.15 ignored mscale / mscale_all_dim,
    g(1) * attn_factor: 1.416 instead of 1.0 for Kimi-K2.5's rope. transformers'
    `_compute_yarn_parameters` gives the same as SGLang >= 0.5.16 except that it takes an
    `attention_factor` key verbatim, ignores `attn_factor`, and falls back to g(1) when mscale or
    mscale_all_dim is 0.
    """
    params = scaling or {}
    if params.get("rope_type") != "yarn":
        return 1.0
    factor, mscale, mscale_all_dim = (
        params["factor"],
        params.get("mscale"),
        params.get("mscale_all_dim"),
    )
    if mscale is not None and mscale_all_dim is not None:
        magnitude = _yarn_get_mscale(factor, mscale) / _yarn_get_mscale(factor, mscale_all_dim)
    else:
        magnitude = _yarn_get_mscale(factor, 1.0)
    return magnitude * params.get("attn_factor", 1)


# SGLang reads yarn's mscale / mscale_all_dim from this release on (earlier: always g(1)).
YARN_MSCALE_KEYS_FROM = (0, 5, 16)


def rope_serving_problem(
    scaling: dict | None, sglang_version: tuple[int, ...] | None
) -> str | None:
    """Why SGLang would rotate q and k differently from training, or None.

    Before 0.5.16 SGLang ignores yarn's mscale / mscale_all_dim (see `rope_magnitude`): where they
    change the magnitude, a drafter trained with them is served with another one. Unless the
    serving version is known to read them (`sglang_version`), that is refused before training."""
    if scaling is None or scaling.get("rope_type") != "yarn":
        return None
    old = {k: v for k, v in scaling.items() if k not in ("mscale", "mscale_all_dim")}
    trained, served_old = rope_magnitude(scaling), rope_magnitude(old)
    if math.isclose(trained, served_old, rel_tol=1e-6):
        return None
    if sglang_version is not None and sglang_version >= YARN_MSCALE_KEYS_FROM:
        return None
    return (
        f"yarn with mscale {scaling.get('mscale')} / mscale_all_dim "
        f"{scaling.get('mscale_all_dim')} scales cos/sin by {trained:.4f}, but SGLang before "
        f"0.5.16 serves {served_old:.4f} (it ignores those keys): name the serving SGLang "
        f"version (0.5.16 or later), or train with plain RoPE (rope: plain)"
    )


class Rope(NamedTuple):
    """How q and k are rotated: fp32 inverse frequencies and the cos/sin magnitude."""

    inv_freq: Tensor
    magnitude: float = 1.0


def apply_rope(x: Tensor, positions: Tensor, rope: Rope) -> Tensor:
    """Rotate [B, heads, Q, head_dim] by the angles of `positions` [Q] (rotate-half layout); cos
    and sin are scaled by the magnitude in fp32 before the cast, as SGLang's cos/sin cache is."""
    angles = positions.float()[:, None] * rope.inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    cos = (angles.cos() * rope.magnitude).to(x.dtype)
    sin = (angles.sin() * rope.magnitude).to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rotate(x: Tensor, positions: Tensor, rope: Rope) -> Tensor:
    """`apply_rope` as training runs it: on a GPU one kernel each way instead of eight."""
    return compiled_on_gpu(apply_rope, x.is_cuda)(x, positions, rope)


class Linear(nn.Linear):
    """nn.Linear without bias; with `fp8` set (training with `train.fp8`) its three products
    (forward, input and weight gradients) run in FP8 (`fp8.py`)."""

    fp8 = False

    def forward(self, x: Tensor) -> Tensor:
        return fp8_linear(x, self.weight) if self.fp8 else F.linear(x, self.weight)


def use_fp8(drafter: nn.Module, on: bool) -> dict[str, tuple[int, int]]:
    """Switch every `Linear` of a drafter (EAGLE-3's or DFlash's) to FP8 products (or back);
    their (in, out) widths."""
    widths = {}
    for name, module in drafter.named_modules():
        if isinstance(module, Linear):
            module.fp8 = on
            widths[name] = (module.in_features, module.out_features)
    return widths


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return compiled_on_gpu(rms_norm, x.is_cuda)(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """In float32, weight included, rounded once to the input's dtype (as SGLang's fused kernel):
    under autocast a bf16 input stays bf16 instead of meeting a float32 weight. Compiled on a GPU
    into one kernel forward and one backward that keep only the input and its inverse norm (eager,
    the float32 intermediates of each norm cost a share of the step's time and peak memory:
    docs/performance.md)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


_COMPILED: dict = {}


def compiled_on_gpu(fn, on_gpu: bool):
    """fn, compiled once per process on a GPU (one fused kernel; dynamic shapes, so every length
    and batch shares it), eager elsewhere."""
    if not on_gpu or torch.compiler.is_compiling():  # inside a compiled caller: its graph
        return fn
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


@dataclass
class DraftKV:
    """Keys/values the draft layer attends to: the prefix (first step) and each query's chain.

    `query_index[q]` is the prefix position of query q; `chain_k[j]` holds the keys of chain step
    j + 1 for every query, so chain attention is a per-query dot product, never a T x T mask.
    """

    prefix_k: Tensor  # [B, kv_heads, T, head_dim]
    prefix_v: Tensor
    key_mask: Tensor  # [B, T] bool: prefix positions that may be attended
    query_index: Tensor  # [Q] int64
    chain_k: list[Tensor] = field(default_factory=list)  # each [B, kv_heads, Q, head_dim]
    chain_v: list[Tensor] = field(default_factory=list)

    @property
    def chain_length(self) -> int:
        return len(self.chain_k)

    def with_chain(self, k: Tensor, v: Tensor) -> DraftKV:
        return DraftKV(
            self.prefix_k,
            self.prefix_v,
            self.key_mask,
            self.query_index,
            self.chain_k + [k],
            self.chain_v + [v],
        )

    def select_queries(self, index: Tensor) -> DraftKV:
        """Keep only the queries at `index` (e.g. the last prefix position for decoding)."""
        return DraftKV(
            self.prefix_k,
            self.prefix_v,
            self.key_mask,
            self.query_index[index],
            [k[:, :, index] for k in self.chain_k],
            [v[:, :, index] for v in self.chain_v],
        )


class Projections(nn.Module):
    """The q/k/v projections of `in_width`-wide inputs and o back to hidden_size
    (`self_attn.{q,k,v,o}_proj` in both drafter families' checkpoints), and the choice both
    families' attention makes between flex attention and its reference form."""

    def __init__(self, cfg: LayerShape, in_width: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.q_proj = Linear(in_width, self.heads * self.head_dim, bias=False)
        self.k_proj = Linear(in_width, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = Linear(in_width, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = Linear(self.heads * self.head_dim, cfg.hidden_size, bias=False)
        # "auto": fused flex attention on a GPU where the family's forward can take it, the
        # reference elsewhere; "reference" / "flex" force one (benchmarks compare them; tests
        # check they agree)
        self.impl = "auto"

    def flex_chosen(self, fits_on_gpu: bool) -> bool:
        """Whether the forward attends through flex attention: forced, or "auto" where the
        family says it fits on a GPU, with heads at least FLEX_MIN_HEAD_DIM wide (the fused
        kernel refuses narrower ones, compiled or not: a tiny draft then takes the reference)."""
        fits = fits_on_gpu and self.head_dim >= FLEX_MIN_HEAD_DIM
        return self.impl == "flex" or (self.impl == "auto" and fits)


class Attention(Projections):
    """Llama attention whose q/k/v read the 2 * hidden wide [embedding ; hidden] input."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__(cfg, 2 * cfg.hidden_size)

    def uses_flex(self, on_gpu: bool, queries: int) -> bool:
        """Whether `forward` attends through `attend_flex`: `flex_chosen` on a GPU over a whole
        prefix (one query per sample, decoding, takes the reference)."""
        return self.flex_chosen(on_gpu and queries > 1)

    def forward(
        self, x: Tensor, rope: Rope, kv: DraftKV | None, key_mask: Tensor | None
    ) -> tuple[Tensor, DraftKV]:
        B, Q, _ = x.shape
        q = self.q_proj(x).view(B, Q, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, Q, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, Q, self.kv_heads, self.head_dim).transpose(1, 2)
        if kv is None:  # first step: these positions are the prefix
            positions = torch.arange(Q, device=x.device)
            if key_mask is None:
                key_mask = torch.ones(B, Q, dtype=torch.bool, device=x.device)
            k = rotate(k, positions, rope)
            kv = DraftKV(k, v, key_mask.bool(), positions)
        else:  # chain step: every query extends its own chain by one position
            if kv.query_index.numel() != Q:
                raise ValueError(
                    f"chain step got {Q} queries, the cache tracks {kv.query_index.numel()}"
                )
            positions = kv.query_index + kv.chain_length + 1
            kv = kv.with_chain(rotate(k, positions, rope), v)
        q = rotate(q, positions, rope)
        out = attend_flex(q, kv) if self.uses_flex(x.is_cuda, Q) else attend(q, kv)
        return self.o_proj(out.transpose(1, 2).reshape(B, Q, -1)), kv


def attend(q: Tensor, kv: DraftKV) -> Tensor:
    """Softmax attention of q [B, heads, Q, d] over the causal prefix plus each query's chain.

    The reference: plain einsums over the full Q x T score matrix, softmax in fp32. Memory grows
    with Q x T (16 GiB of fp32 scores at 64 heads and 8192 positions); `attend_flex` computes the
    same without materialising it."""
    B, H, Q, d = q.shape
    kv_heads, T = kv.prefix_k.shape[1], kv.prefix_k.shape[2]
    qg = q.view(B, kv_heads, H // kv_heads, Q, d)
    scale = d**-0.5
    scores = torch.einsum("bhgqd,bhtd->bhgqt", qg, kv.prefix_k) * scale
    keys = torch.arange(T, device=q.device)
    causal = keys[None, :] <= kv.query_index[:, None]  # [Q, T]
    allowed = (causal[None] & kv.key_mask[:, None, :]) | (keys[None, :] == kv.query_index[:, None])
    scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
    if kv.chain_k:
        chain_k = torch.stack(kv.chain_k, dim=-2)  # [B, kvh, Q, C, d]
        chain_scores = torch.einsum("bhgqd,bhqcd->bhgqc", qg, chain_k) * scale
        scores = torch.cat([scores, chain_scores], dim=-1)
    probs = scores.float().softmax(dim=-1).to(q.dtype)
    out = torch.einsum("bhgqt,bhtd->bhgqd", probs[..., :T], kv.prefix_v)
    if kv.chain_v:
        chain_v = torch.stack(kv.chain_v, dim=-2)
        out = out + torch.einsum("bhgqc,bhqcd->bhgqd", probs[..., T:], chain_v)
    return out.reshape(B, H, Q, d)


# torch 2.11's flex attention kernel: "embedding dimension of the query, key, and value must be
# at least 16" (stories260K's heads are 8 wide)
FLEX_MIN_HEAD_DIM = 16


def attend_flex(q: Tensor, kv: DraftKV) -> Tensor:
    """`attend` through flex attention, for queries that are the prefix positions (query q at
    position q, as in training): the prefix and every chain step's keys in one sequence, each
    segment padded to whole blocks, with the block mask of that layout (`ttt_mask`). Blocks the
    mask empties are skipped, so the chain costs C diagonal blocks per row of blocks, not C x T.
    Compiled into one fused kernel on a GPU; plain (materialised) on the CPU, where it serves to
    check it against the reference."""
    B, H, Q, d = q.shape
    T = kv.prefix_k.shape[2]
    if Q != T:
        raise ValueError(
            f"attend_flex: {Q} queries over a {T}-position prefix; it takes one query per "
            "prefix position (training); use `attend` for a subset of queries"
        )
    pad = (0, 0, 0, padded_length(T) - T)
    keys = F.pad(torch.stack([kv.prefix_k, *kv.chain_k], 2), pad).flatten(2, 3)
    values = F.pad(torch.stack([kv.prefix_v, *kv.chain_v], 2), pad).flatten(2, 3)
    block_mask = ttt_block_mask(kv.key_mask, kv.chain_length)
    return flex_attention_kernel(q.is_cuda)(q, keys, values, block_mask=block_mask, enable_gqa=True)


def flex_attention_kernel(compiled: bool):
    """flex_attention through `compiled_on_gpu`: on a GPU the fused kernel, one for every prefix
    and chain length (static shapes would recompile per batch length and TTT step, and fall back
    to the unfused form at the limit); eager on the CPU."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return compiled_on_gpu(flex_attention, compiled)


class MLP(nn.Module):
    """The SwiGLU MLP of a draft layer (both drafter families)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(compiled_on_gpu(swiglu, x.is_cuda)(gate, up))


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """SiLU(gate) * up: on a GPU one kernel each way, keeping no SiLU output for the backward."""
    return F.silu(gate) * up


class DraftLayer(nn.Module):
    """The draft's single decoder layer (`midlayer` in the exported weights)."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self,
        embeds: Tensor,
        hidden: Tensor,
        rope: Rope,
        kv: DraftKV | None,
        key_mask: Tensor | None,
    ) -> tuple[Tensor, DraftKV]:
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        x, kv = self.self_attn(x, rope, kv, key_mask)
        residual = x + residual
        out = self.mlp(self.post_attention_layernorm(residual)) + residual
        return out, kv


class DraftStep(NamedTuple):
    logits: Tensor  # [B, Q, draft_vocab]
    out: Tensor  # [B, Q, hidden], before the final norm: the next step's hidden state
    kv: DraftKV


class Eagle3Drafter(nn.Module):
    """The draft model. Parameter and buffer names are the exported checkpoint's key names."""

    d2t: Tensor  # buffers, registered in __init__
    t2d: Tensor

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.cfg = cfg
        self.fc = Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # Until set_vocab: the first draft_vocab_size target ids.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[: cfg.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        # Not a buffer: casting the model to bf16 must not round the rotary frequencies.
        self.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.rope_magnitude = rope_magnitude(cfg.rope_scaling)

    def set_vocab(self, d2t: Tensor, t2d: Tensor) -> None:
        """Install the draft vocabulary mapping (target_id = i + d2t[i]; t2d marks kept ids)."""
        if d2t.shape != self.d2t.shape or t2d.shape != self.t2d.shape:
            raise ValueError(
                f"set_vocab: d2t {tuple(d2t.shape)} / t2d {tuple(t2d.shape)} do not "
                f"fit draft_vocab_size {self.cfg.draft_vocab_size} / vocab_size "
                f"{self.cfg.vocab_size}"
            )
        if not torch.equal(t2d.bool().nonzero().flatten().cpu(), self.draft_ids(d2t).cpu()):
            raise ValueError("set_vocab: t2d does not mark exactly the ids i + d2t[i] (ascending)")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def use_fp8(self, on: bool) -> dict[str, tuple[int, int]]:
        """`use_fp8` over this drafter's linear layers."""
        return use_fp8(self, on)

    def draft_ids(self, d2t: Tensor | None = None) -> Tensor:
        """Target id of each draft-vocabulary index."""
        d2t = self.d2t if d2t is None else d2t
        return torch.arange(d2t.numel(), device=d2t.device) + d2t

    def step(
        self,
        embeds: Tensor,
        hidden: Tensor,
        kv: DraftKV | None = None,
        key_mask: Tensor | None = None,
    ) -> DraftStep:
        """One draft step, shared by training and decoding.

        embeds: [B, Q, hidden] embeddings of the tokens this step reads.
        hidden: [B, Q, num_aux * target_hidden] target features (first step, runs `fc`) or the
            previous step's `out` [B, Q, hidden] (chain step).
        kv: None for the first step (its Q positions become the prefix, attended causally, with
            `key_mask` [B, Q] hiding padding), else the cache returned by the previous step.
        """
        if hidden.shape[-1] != self.cfg.hidden_size:
            hidden = self.fc(hidden)
        rope = Rope(self.inv_freq.to(embeds.device), self.rope_magnitude)
        out, kv = self.midlayer(embeds, hidden, rope, kv, key_mask)
        return DraftStep(self.lm_head(self.norm(out)), out, kv)


def embed_tokens(embed: nn.Embedding | Tensor, ids: Tensor) -> Tensor:
    """Look up the target's (frozen) token embedding, given as a module or its weight."""
    if isinstance(embed, nn.Embedding):
        return embed(ids)
    return F.embedding(ids, embed)
