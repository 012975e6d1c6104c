import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from stages.drafter.export import expected_tensors
from stages.drafter.model import Eagle3Config, Eagle3Drafter, rope_inv_freq, target_facts

from .conftest import HIDDEN, make_drafter, tiny_target_config

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_parameter_names_are_the_checkpoint_keys(drafter):
    state = drafter.state_dict()
    expected = expected_tensors(drafter.cfg)
    assert set(state) == set(expected)
    for key, (shape, dtype) in expected.items():
        assert tuple(state[key].shape) == shape, key
        if dtype is not None:
            assert state[key].dtype == dtype, key
    assert not any("embed" in k for k in state)


def test_from_target_reads_both_rope_layouts_and_nested_text_config():
    new_style = LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rope_scaling=dict(LLAMA3_ROPE),
    )
    legacy = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": 8,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 300,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0,
            "rope_scaling": {
                **{k: v for k, v in LLAMA3_ROPE.items() if k != "rope_type"},
                "type": "llama3",
            },
        },
    }
    a = Eagle3Config.from_target(new_style, 100, [2, 4, 5])
    b = Eagle3Config.from_target(legacy, 100, [2, 4, 5])
    assert a == b
    assert a.rope_scaling == LLAMA3_ROPE and a.rope_theta == 500000.0
    assert (a.head_dim, a.target_hidden_size, a.num_aux) == (16, 64, 3)
    assert target_facts(legacy).architecture == "KimiK25ForConditionalGeneration"


def test_from_target_overrides_and_rejections(target_config):
    cfg = Eagle3Config.from_target(target_config, 100, [2, 4, 5], intermediate_size=200)
    assert cfg.intermediate_size == 200
    with pytest.raises(ValueError, match="unknown overrides"):
        Eagle3Config.from_target(target_config, 100, [2, 4, 5], hiden_size=3)
    dynamic = tiny_target_config(rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    with pytest.raises(ValueError, match="rope_scaling=None"):
        Eagle3Config.from_target(dynamic, 100, [2, 4, 5])
    assert Eagle3Config.from_target(dynamic, 100, [2, 4, 5], rope_scaling=None).rope_scaling is None
    with pytest.raises(ValueError, match="num_aux"):
        Eagle3Config.from_target(target_config, 100, [2, 4, 5], num_aux=2)


@pytest.mark.parametrize("scaling", [None, LLAMA3_ROPE, {"rope_type": "linear", "factor": 4.0}])
def test_rope_frequencies_match_transformers(scaling):
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        rope_theta=500000.0,
        max_position_embeddings=131072,
        rope_scaling=dict(scaling) if scaling else None,
    )
    rope_type = (scaling or {}).get("rope_type")
    if rope_type:
        reference = ROPE_INIT_FUNCTIONS[rope_type](config)[0]
    else:
        reference = 1.0 / 500000.0 ** (torch.arange(0, 64, 2).float() / 64)
    torch.testing.assert_close(rope_inv_freq(64, 500000.0, scaling), reference)


def test_fc_runs_only_on_target_wide_input(drafter):
    torch.manual_seed(0)
    embeds, aux = torch.randn(1, 5, HIDDEN), torch.randn(1, 5, 3 * HIDDEN)
    from_aux = drafter.step(embeds, aux)
    from_projected = drafter.step(embeds, drafter.fc(aux))
    torch.testing.assert_close(from_aux.logits, from_projected.logits)
    torch.testing.assert_close(from_aux.out, from_projected.out)


def unroll(drafter, embeds, aux, steps, key_mask=None):
    """Run `steps` draft steps feeding `out` back, with per-step embeddings embeds[k]."""
    outs, hidden, kv = [], aux, None
    for k in range(steps):
        step = drafter.step(embeds[k], hidden, kv, key_mask=key_mask)
        outs.append(step.logits)
        hidden, kv = step.out, step.kv
    return outs


@torch.no_grad()
def test_queries_see_only_their_prefix_and_their_own_chain(drafter):
    torch.manual_seed(0)
    T, steps, i = 6, 3, 2
    embeds, aux = torch.randn(steps, 1, T, HIDDEN), torch.randn(1, T, 3 * HIDDEN)
    base = unroll(drafter, embeds, aux, steps)
    # Later prefix positions and other positions' chain inputs must not reach position i.
    embeds2, aux2 = embeds.clone(), aux.clone()
    aux2[:, i + 1 :] += 1.0
    embeds2[0, :, i + 1 :] += 1.0
    embeds2[1:, :, :i] += 1.0
    embeds2[1:, :, i + 1 :] += 1.0
    changed = unroll(drafter, embeds2, aux2, steps)
    for k in range(steps):
        torch.testing.assert_close(
            changed[k][:, : i + 1] if k == 0 else changed[k][:, i],
            base[k][:, : i + 1] if k == 0 else base[k][:, i],
        )
    # ...while an earlier prefix position and this position's own chain do.
    for perturb in ((0, i - 1), (1, i)):
        embeds3 = embeds.clone()
        embeds3[perturb[0], :, perturb[1]] += 1.0
        assert not torch.allclose(unroll(drafter, embeds3, aux, steps)[2][:, i], base[2][:, i])


@torch.no_grad()
def test_masked_positions_are_never_attended(drafter):
    torch.manual_seed(0)
    T, steps = 7, 3
    embeds, aux = torch.randn(steps, 2, T, HIDDEN), torch.randn(2, T, 3 * HIDDEN)
    key_mask = torch.ones(2, T, dtype=torch.bool)
    key_mask[0, :2] = False  # left padding
    key_mask[1, 5:] = False  # right padding
    base = unroll(drafter, embeds, aux, steps, key_mask)
    embeds2, aux2 = embeds.clone(), aux.clone()
    aux2[~key_mask] += 3.0
    embeds2[:, ~key_mask] += 3.0
    changed = unroll(drafter, embeds2, aux2, steps, key_mask)
    for k in range(steps):
        torch.testing.assert_close(changed[k][key_mask], base[k][key_mask])
    # Each row of a batch is computed as if alone.
    alone = unroll(drafter, embeds[:, 1:], aux[1:], steps, key_mask[1:])
    for k in range(steps):
        torch.testing.assert_close(alone[k][0, :5], base[k][1, :5])


def test_set_vocab_rejects_inconsistent_maps(target_config):
    drafter = make_drafter(target_config)
    d2t, t2d = drafter.d2t.clone(), drafter.t2d.clone()
    t2d[(drafter.draft_ids()[0] + 1) % t2d.numel()] ^= True
    with pytest.raises(ValueError, match="t2d does not mark"):
        drafter.set_vocab(d2t, t2d)
    with pytest.raises(ValueError, match="do not fit"):
        drafter.set_vocab(d2t[:-1], drafter.t2d)


def test_bf16_cast_keeps_rotary_frequencies_exact(drafter):
    cfg = drafter.cfg
    half = Eagle3Drafter(cfg).to(torch.bfloat16)
    torch.testing.assert_close(half.inv_freq, rope_inv_freq(cfg.head_dim, cfg.rope_theta, None))
    assert half.inv_freq.dtype == torch.float32


@pytest.mark.slow
def test_the_norm_compiles_once_and_matches_its_eager_form():
    """What a GPU runs (`compiled_on_gpu(rms_norm)`), compiled here by the CPU backend: output
    and gradients equal the eager norm's for several lengths and batches, from one graph (dynamic
    shapes: no recompilation per length or batch; a dimension of size 1 would add one more)."""
    import torch._dynamo

    from stages.drafter.model import rms_norm

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    compiled = torch.compile(rms_norm, dynamic=True)
    g = torch.Generator().manual_seed(0)
    for shape in [(2, 24, 16), (2, 40, 16), (3, 7, 16)]:
        x = (3 * torch.randn(shape, generator=g)).bfloat16().requires_grad_()
        weight = (1 + torch.randn(16, generator=g)).requires_grad_()
        grad_out = torch.randn(shape, generator=g).bfloat16()
        got = compiled(x, weight, 1e-6)
        want = rms_norm(x, weight, 1e-6)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)
        got_grads = torch.autograd.grad(got, (x, weight), grad_out)
        want_grads = torch.autograd.grad(want, (x, weight), grad_out)
        torch.testing.assert_close(got_grads, want_grads, rtol=2e-2, atol=2e-2)
    assert counts["stats"]["unique_graphs"] == 1, dict(counts["stats"])
