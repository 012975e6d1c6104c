"""YaRN RoPE in the draft layer, checked against transformers and a hand-written reference.

The reference below restates SGLang's formula (models/llama.py -> rotary_embedding `get_rope` ->
`YaRNScalingRotaryEmbedding`, SGLang 0.5.16 and later) pair by pair in float64 numpy, as the
serving engine would build its cos/sin table; the drafter must agree with it, and with
transformers wherever transformers agrees with SGLang.
"""

import json
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from stages.drafter.export import (
    ExportError,
    config_from_json,
    export_drafter,
    load_drafter,
    serving_config,
)
from stages.drafter.model import (
    Eagle3Config,
    Eagle3Drafter,
    Rope,
    apply_rope,
    rope_inv_freq,
    rope_magnitude,
    rope_serving_problem,
)

from .conftest import HIDDEN, tiny_target_config

# Kimi-K2.5's text_config rope, as rope_fields normalises it.
KIMI_THETA, KIMI_MAX_POSITIONS = 50000.0, 262144
KIMI_YARN = {
    "rope_type": "yarn",
    "factor": 64.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
DEEPSEEK_V3_YARN = {**KIMI_YARN, "factor": 40.0}
# (head_dim, theta, rope_scaling): Kimi-K2.5 on the published drafters' 128-wide heads, DeepSeek-V3,
# and smaller ones that move every knob transformers reads the same way.
CASES = [
    (128, KIMI_THETA, KIMI_YARN),
    (128, 10000.0, DEEPSEEK_V3_YARN),
    (64, 10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}),
    (
        64,
        500000.0,
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
            "beta_fast": 16,
            "beta_slow": 2,
            "truncate": False,
        },
    ),
    (
        16,
        10000.0,
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 0.5,
        },
    ),
]
# SGLang-only keys: transformers reads neither.
SGLANG_ONLY = (16, 10000.0, {**CASES[-1][2], "extrapolation_factor": 0.5, "attn_factor": 0.9})
LEGACY_SGLANG_KIMI_MAGNITUDE = 0.1 * math.log(64) + 1  # SGLang <= 0.5.15: mscale keys ignored


def sglang_yarn(head_dim: int, theta: float, s: dict) -> tuple[np.ndarray, float]:
    """(inv_freq per rotary pair, cos/sin magnitude), one pair at a time, in float64."""
    factor, length = s["factor"], s["original_max_position_embeddings"]

    def pair_turning(rotations):  # the (fractional) pair index that turns `rotations` times
        return head_dim * math.log(length / (2 * math.pi * rotations)) / (2 * math.log(theta))

    lo, hi = pair_turning(s.get("beta_fast", 32)), pair_turning(s.get("beta_slow", 1))
    if s.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    hi = hi + 0.001 if hi == lo else hi
    inv_freq = []
    for i in range(head_dim // 2):
        plain = theta ** (-2 * i / head_dim)
        extrapolate = (1 - min(max((i - lo) / (hi - lo), 0.0), 1.0)) * s.get(
            "extrapolation_factor", 1
        )
        inv_freq.append(extrapolate * plain + (1 - extrapolate) * plain / factor)

    def g(m):
        return 0.1 * m * math.log(factor) + 1 if factor > 1 else 1.0

    if s.get("mscale") is not None and s.get("mscale_all_dim") is not None:
        magnitude = g(s["mscale"]) / g(s["mscale_all_dim"])
    else:
        magnitude = g(1)
    return np.array(inv_freq), magnitude * s.get("attn_factor", 1)


def transformers_yarn(head_dim: int, theta: float, s: dict) -> tuple[torch.Tensor, float]:
    config = LlamaConfig(
        hidden_size=4 * head_dim,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=int(s["factor"] * s["original_max_position_embeddings"]),
        rope_theta=theta,
        rope_scaling=dict(s),
    )
    return ROPE_INIT_FUNCTIONS["yarn"](config)


@pytest.mark.parametrize("head_dim, theta, scaling", CASES + [SGLANG_ONLY])
def test_yarn_matches_the_sglang_formula(head_dim, theta, scaling):
    inv_freq, magnitude = sglang_yarn(head_dim, theta, scaling)
    ours = rope_inv_freq(head_dim, theta, scaling)
    assert ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), inv_freq, rtol=1e-6)
    assert rope_magnitude(scaling) == pytest.approx(magnitude, rel=1e-12)


@pytest.mark.parametrize("head_dim, theta, scaling", CASES)
def test_yarn_frequencies_equal_transformers(head_dim, theta, scaling):
    reference, _ = transformers_yarn(head_dim, theta, scaling)
    assert torch.equal(rope_inv_freq(head_dim, theta, scaling), reference)


def test_kimi_magnitude_is_one_as_sglang_and_transformers_compute_it():
    _, transformers_factor = transformers_yarn(128, KIMI_THETA, KIMI_YARN)
    assert rope_magnitude(KIMI_YARN) == transformers_factor == 1.0
    # Without mscale / mscale_all_dim both fall back to 0.1 ln(64) + 1, and so did SGLang
    # <= 0.5.15 even with them: trained on 1.0, a Kimi drafter served there sees 1.416.
    bare = {k: v for k, v in KIMI_YARN.items() if k not in ("mscale", "mscale_all_dim")}
    assert rope_magnitude(bare) == pytest.approx(LEGACY_SGLANG_KIMI_MAGNITUDE)
    assert pytest.approx(1.4158883, abs=1e-7) == LEGACY_SGLANG_KIMI_MAGNITUDE
    assert transformers_yarn(128, KIMI_THETA, bare)[1] == pytest.approx(1.4158883, abs=1e-7)


@pytest.mark.parametrize(
    "extra, sglang, transformers",
    [
        ({"attn_factor": 0.5}, 0.5, 1.0),  # SGLang multiplies, transformers ignores it
        ({"attention_factor": 0.8}, 1.0, 0.8),  # transformers takes it, SGLang ignores it
        (
            {"mscale": 0.707, "mscale_all_dim": 0},
            1.2940330,
            1.4158883,
        ),  # 0 is falsy in transformers
    ],
)
def test_magnitude_differences_from_transformers(extra, sglang, transformers):
    scaling = {**KIMI_YARN, **extra}
    inv_freq, factor = transformers_yarn(128, KIMI_THETA, scaling)
    assert rope_magnitude(scaling) == pytest.approx(sglang, abs=1e-7)
    assert factor == pytest.approx(transformers, abs=1e-7)
    assert torch.equal(rope_inv_freq(128, KIMI_THETA, scaling), inv_freq)


def test_extrapolation_factor_moves_frequencies_in_sglang_only():
    head_dim, theta, scaling = SGLANG_ONLY
    ignored, _ = transformers_yarn(head_dim, theta, scaling)
    without = {k: v for k, v in scaling.items() if k != "extrapolation_factor"}
    assert torch.equal(ignored, rope_inv_freq(head_dim, theta, without))
    assert not torch.allclose(rope_inv_freq(head_dim, theta, scaling), ignored)


def test_rotation_at_long_positions_matches_the_reference():
    torch.manual_seed(0)
    head_dim, scaling = 128, {**KIMI_YARN, "attn_factor": 1.25}
    _, magnitude = sglang_yarn(head_dim, KIMI_THETA, scaling)
    rope = Rope(rope_inv_freq(head_dim, KIMI_THETA, scaling), rope_magnitude(scaling))
    positions = torch.tensor([0, 1, 4095, 4096, 100000, KIMI_MAX_POSITIONS - 1])
    x = torch.randn(1, 2, len(positions), head_dim)
    out = apply_rope(x, positions, rope).double().numpy()
    half = head_dim // 2
    for n, position in enumerate(positions.tolist()):
        # The angle as the engine's fp32 table holds it (from the fp32 frequencies: at 262k
        # positions one ulp of a frequency is 0.03 rad), everything after in float64.
        angle = (np.float32(position) * rope.inv_freq.numpy()).astype(np.float64)
        a, b = x[0, :, n, :half].double().numpy(), x[0, :, n, half:].double().numpy()
        expected = magnitude * np.concatenate(
            [a * np.cos(angle) - b * np.sin(angle), b * np.cos(angle) + a * np.sin(angle)], axis=-1
        )
        np.testing.assert_allclose(out[0, :, n], expected, atol=1e-5)


def yarn_target(**scaling_changes):
    """The tiny Llama target with Kimi-K2.5's rope (its theta and yarn, at a small length); a
    change to None drops that key."""
    scaling = {
        **KIMI_YARN,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        **scaling_changes,
    }
    return tiny_target_config(
        rope_theta=KIMI_THETA, rope_scaling={k: v for k, v in scaling.items() if v is not None}
    )


def same_weights(cfg_a, cfg_b):
    a, b = Eagle3Drafter(cfg_a).eval(), Eagle3Drafter(cfg_b).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in a.parameters():
            p.normal_(0, 0.3)
    b.load_state_dict(a.state_dict())
    return a, b


def differing_positions(cfg_a, cfg_b) -> tuple[list[bool], bool]:
    """Which prefix positions of a first step differ between two drafters with equal weights, and
    whether the following chain step does."""
    a, b = same_weights(cfg_a, cfg_b)
    embeds, aux = torch.randn(1, 6, HIDDEN), torch.randn(1, 6, 3 * HIDDEN)
    with torch.no_grad():
        step_a, step_b = a.step(embeds, aux), b.step(embeds, aux)
        chain_a, chain_b = (
            a.step(embeds, step_a.out, step_a.kv),
            b.step(embeds, step_b.out, step_b.kv),
        )
    prefix = [not torch.allclose(step_a.out[:, i], step_b.out[:, i]) for i in range(6)]
    return prefix, not torch.allclose(chain_a.logits, chain_b.logits)


def test_yarn_frequencies_change_the_draft_step():
    target = yarn_target()
    yarn = Eagle3Config.from_target(target, 120, [2, 4, 5])
    plain = Eagle3Config.from_target(target, 120, [2, 4, 5], rope="plain")
    assert yarn.rope_scaling["rope_type"] == "yarn" and plain.rope_scaling is None
    assert rope_magnitude(yarn.rope_scaling) == 1.0
    # Position 0 attends to itself alone at angle 0; every later one sees the new frequencies.
    assert differing_positions(yarn, plain) == ([False] + [True] * 5, True)


def test_yarn_magnitude_changes_the_draft_step():
    with_mscale = Eagle3Config.from_target(yarn_target(), 120, [2, 4, 5])
    without = Eagle3Config.from_target(
        yarn_target(mscale=None, mscale_all_dim=None), 120, [2, 4, 5]
    )
    assert torch.equal(
        rope_inv_freq(16, KIMI_THETA, with_mscale.rope_scaling),
        rope_inv_freq(16, KIMI_THETA, without.rope_scaling),
    )
    assert rope_magnitude(without.rope_scaling) == pytest.approx(0.1 * math.log(4) + 1)
    assert differing_positions(with_mscale, without) == ([False] + [True] * 5, True)


def test_rope_choice_in_from_target():
    target = yarn_target()
    mirror = Eagle3Config.from_target(target, 120, [2, 4, 5])
    assert mirror.rope_theta == KIMI_THETA and mirror.rope_scaling["factor"] == 4.0
    plain = Eagle3Config.from_target(target, 120, [2, 4, 5], rope="plain")
    assert (plain.rope_theta, plain.rope_scaling) == (KIMI_THETA, None)
    assert (
        Eagle3Config.from_target(target, 120, [2, 4, 5], rope="plain", rope_theta=1e6).rope_theta
        == 1e6
    )
    with pytest.raises(ValueError, match="rope='plain' drops rope_scaling"):
        Eagle3Config.from_target(target, 120, [2, 4, 5], rope="plain", rope_scaling=KIMI_YARN)
    with pytest.raises(ValueError, match="rope='mirrored'; choose one of 'mirror', 'plain'"):
        Eagle3Config.from_target(target, 120, [2, 4, 5], rope="mirrored")


def test_unsupported_or_incomplete_rope_scaling_is_refused():
    dynamic = tiny_target_config(rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    with pytest.raises(ValueError, match="'dynamic' is not implemented.*rope='plain'"):
        Eagle3Config.from_target(dynamic, 120, [2, 4, 5])
    assert Eagle3Config.from_target(dynamic, 120, [2, 4, 5], rope="plain").rope_scaling is None
    cfg = Eagle3Config.from_target(yarn_target(), 120, [2, 4, 5])
    no_length = {
        k: v for k, v in cfg.rope_scaling.items() if k != "original_max_position_embeddings"
    }
    with pytest.raises(ValueError, match="yarn.*no `original_max_position_embeddings`"):
        Eagle3Config(**{**cfg.__dict__, "rope_scaling": no_length})


def test_yarn_rope_round_trips_through_config_json(tmp_path):
    target = tiny_target_config(
        rope_theta=KIMI_THETA,
        rope_scaling=dict(KIMI_YARN),
        max_position_embeddings=KIMI_MAX_POSITIONS,
    )
    cfg = Eagle3Config.from_target(target, 120, [2, 4, 5])
    written = json.loads(json.dumps(serving_config(cfg, target)))
    assert written["rope_scaling"] == KIMI_YARN and written["rope_theta"] == KIMI_THETA
    assert written["rope_parameters"] == {**KIMI_YARN, "rope_theta": KIMI_THETA}
    assert config_from_json(written) == cfg
    # What a transformers-based loader reads from the same file agrees too.
    served = LlamaConfig(**{k: v for k, v in written.items() if k != "rope_scaling"})
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](served)
    drafter = Eagle3Drafter(cfg)
    assert torch.equal(drafter.inv_freq, inv_freq) and drafter.rope_magnitude == factor == 1.0
    with pytest.raises(ExportError, match="SGLang before 0.5.16 serves 1.4159"):
        export_drafter(drafter, cfg, tmp_path / "old", target, {})
    out = export_drafter(drafter, cfg, tmp_path / "yarn", target, {}, sglang_version="0.5.16")
    loaded, loaded_cfg = load_drafter(out)
    assert loaded_cfg == cfg and torch.equal(loaded.inv_freq, drafter.inv_freq)


@pytest.mark.parametrize(
    "scaling, version, refused",
    [
        (KIMI_YARN, None, True),  # 1.0 trained, 1.416 on SGLang <= 0.5.15
        (KIMI_YARN, (0, 5, 15), True),
        (KIMI_YARN, (0, 5, 16), False),
        (KIMI_YARN, (0, 5, 23), False),
        (
            {k: v for k, v in KIMI_YARN.items() if k not in ("mscale", "mscale_all_dim")},
            None,
            False,
        ),
        (None, None, False),
    ],
)
def test_a_magnitude_old_sglang_would_serve_differently_is_refused(scaling, version, refused):
    problem = rope_serving_problem(scaling, version)
    assert (problem is not None) == refused
    if refused:
        assert "1.0000" in problem and "1.4159" in problem and "0.5.16" in problem
