"""The DFlash objective against an independent implementation written here: one block at a time,
the context cut at the anchor (what SGLang's worker holds when it drafts that block), attention,
norms and rotary angles by hand, the loss summed position by position. The loss and the gradient
of every parameter must agree; planted changes (a causal block, the anchor's own features in the
context, no position decay) must make them disagree."""

from __future__ import annotations

import math

import pytest
import torch

from stages.dflash.objective import (
    Anchors,
    DFlashObjective,
    block_labels,
    block_visibility,
    dflash_loss,
    eligible_anchors,
    position_weights,
    sample_anchors,
)

from .conftest import MASK_ID, make_drafter, random_batch, target_weights

GAMMA = 7.0


def rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def rotated(x, positions, theta):
    """Rotate-half rotary embedding of x [L, d] at integer positions [L]."""
    d = x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions[:, None].float() * freqs[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[:, : d // 2], x[:, d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(p, cfg, h, ctx, ctx_pos, block_pos, causal):
    """One layer's attention of the block h [bs, H] over [ctx ; h], head by head."""
    d, heads, kv_heads = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    keys_in = torch.cat([ctx, h])
    key_pos = torch.cat([ctx_pos, block_pos])
    q_all, k_all, v_all = h @ p["q_proj"].T, keys_in @ p["k_proj"].T, keys_in @ p["v_proj"].T
    outs = []
    for head in range(heads):
        g = head // (heads // kv_heads)
        q = rotated(
            rms(q_all[:, head * d : (head + 1) * d], p["q_norm"], cfg.rms_norm_eps),
            block_pos,
            cfg.rope_theta,
        )
        k = rotated(
            rms(k_all[:, g * d : (g + 1) * d], p["k_norm"], cfg.rms_norm_eps),
            key_pos,
            cfg.rope_theta,
        )
        scores = q @ k.T / math.sqrt(d)
        if causal:
            n_ctx = ctx.shape[0]
            for i in range(h.shape[0]):
                scores[i, n_ctx + i + 1 :] = float("-inf")
        outs.append(torch.softmax(scores, -1) @ v_all[:, g * d : (g + 1) * d])
    return torch.cat(outs, -1) @ p["o_proj"].T


def draft_block(drafter, embed, aux_prefix, block_ids, anchor, causal=False):
    """The block's final hidden states [bs, H], as the worker drafts it after a prefix."""
    cfg, P = drafter.cfg, dict(drafter.named_parameters())
    ctx = rms(aux_prefix @ P["fc.weight"].T, P["hidden_norm.weight"], cfg.rms_norm_eps)
    ctx_pos = torch.arange(aux_prefix.shape[0])
    block_pos = anchor + torch.arange(len(block_ids))
    x = embed[block_ids]
    for i in range(cfg.num_hidden_layers):
        p = {k.split(".")[-2]: v for k, v in P.items() if k.startswith(f"layers.{i}.")}
        h = rms(x, P[f"layers.{i}.input_layernorm.weight"], cfg.rms_norm_eps)
        x = x + attention(p, cfg, h, ctx, ctx_pos, block_pos, causal)
        h = rms(x, P[f"layers.{i}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
        gate, up = h @ p["gate_proj"].T, h @ p["up_proj"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ p["down_proj"].T
    return rms(x, P["norm.weight"], cfg.rms_norm_eps)


def reference_loss(
    drafter, embed, lm_head, batch, anchors, *, causal=False, see_anchor=False, decay=True
):
    """Weighted mean over blocks and positions of w_k * m * CE, block by block."""
    bs = drafter.cfg.block_size
    total, weight_sum = torch.zeros(()), torch.zeros(())
    for b in range(anchors.positions.shape[0]):
        for n in range(anchors.positions.shape[1]):
            if not anchors.valid[b, n]:
                continue
            a = int(anchors.positions[b, n])
            ids = [int(batch["input_ids"][b, a])] + [MASK_ID] * (bs - 1)
            prefix = batch["aux"][b, : a + 1 if see_anchor else a]
            hidden = draft_block(drafter, embed, prefix, torch.tensor(ids), a, causal)
            for k in range(1, bs):
                w = (math.exp(-(k - 1) / GAMMA) if decay else 1.0) * float(
                    batch["loss_mask"][b, a + k]
                )
                logits = hidden[k] @ lm_head.T
                ce = torch.logsumexp(logits, -1) - logits[batch["input_ids"][b, a + k]]
                total, weight_sum = total + w * ce, weight_sum + w
    return total / weight_sum


@pytest.fixture
def setup(target_config):
    drafter = make_drafter(target_config)
    batch = random_batch(drafter.cfg, [24, 17])
    embed, lm_head = target_weights(drafter.cfg)
    anchors = sample_anchors(
        batch["loss_mask"], batch["attention_mask"], 4, 3, torch.Generator().manual_seed(5)
    )
    return drafter, batch, embed, lm_head, anchors


def gradients(drafter, loss):
    drafter.zero_grad()
    loss.backward()
    return {k: p.grad.clone() for k, p in drafter.named_parameters()}


def library_loss(drafter, batch, embed, lm_head, anchors):
    return dflash_loss(
        drafter,
        embed,
        lm_head,
        batch["aux"],
        batch["input_ids"],
        batch["loss_mask"],
        anchors,
        GAMMA,
    )[0]


def test_loss_and_every_gradient_equal_the_reference(setup):
    drafter, batch, embed, lm_head, anchors = setup
    assert anchors.valid.sum() == 6  # several blocks per sequence in one forward
    ours = library_loss(drafter, batch, embed, lm_head, anchors)
    theirs = reference_loss(drafter, embed, lm_head, batch, anchors)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=0)
    g_ours, g_theirs = gradients(drafter, ours), gradients(drafter, theirs)
    assert len(g_ours) == 3 + 2 * 11
    for key in g_ours:
        assert g_ours[key].abs().sum() > 0, key
        torch.testing.assert_close(g_ours[key], g_theirs[key], rtol=1e-5, atol=1e-7, msg=key)


@pytest.mark.parametrize("planted", [{"causal": True}, {"see_anchor": True}, {"decay": False}])
def test_a_planted_change_breaks_the_comparison(setup, planted):
    drafter, batch, embed, lm_head, anchors = setup
    ours = library_loss(drafter, batch, embed, lm_head, anchors)
    theirs = reference_loss(drafter, embed, lm_head, batch, anchors, **planted)
    assert not torch.allclose(ours, theirs, rtol=1e-3, atol=0), planted


def test_anchors_are_supervised_distinct_sorted_and_their_blocks_fit(target_config):
    batch = random_batch(make_drafter(target_config).cfg, [24, 17, 6])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        anchors = sample_anchors(batch["loss_mask"], batch["attention_mask"], 4, 5, g)
        for b, length in enumerate([24, 17, 6]):
            chosen = anchors.positions[b][anchors.valid[b]].tolist()
            assert chosen == sorted(set(chosen))
            assert all(batch["loss_mask"][b, a] and a + 4 <= length for a in chosen)
            eligible = int(
                eligible_anchors(
                    batch["loss_mask"][b : b + 1], batch["attention_mask"][b : b + 1], 4
                ).sum()
            )
            assert len(chosen) == min(5, eligible)
            assert anchors.valid[b].tolist() == sorted(anchors.valid[b].tolist(), reverse=True)
    assert not anchors.valid[2].any()  # 6 tokens, prompt 3: no supervised block fits
    assert (anchors.positions[~anchors.valid] == 0).all()


def test_every_eligible_anchor_is_drawn_over_many_draws(target_config):
    batch = random_batch(make_drafter(target_config).cfg, [24])
    eligible = eligible_anchors(batch["loss_mask"], batch["attention_mask"], 4)[0]
    g, seen = torch.Generator().manual_seed(1), set()
    for _ in range(200):
        anchors = sample_anchors(batch["loss_mask"], batch["attention_mask"], 4, 2, g)
        seen |= set(anchors.positions[anchors.valid].tolist())
    assert seen == set(eligible.nonzero().flatten().tolist())


def test_the_mask_shows_the_context_before_the_anchor_and_the_own_block_both_ways():
    anchors = Anchors(torch.tensor([[2, 5, 0]]), torch.tensor([[True, True, False]]))
    mask = block_visibility(anchors, 2).dense(8)[0].int()
    expected = torch.zeros(6, 14, dtype=torch.int)
    expected[0:2, 0:2] = 1  # block 0 (anchor 2): context 0, 1
    expected[2:4, 0:5] = 1  # block 1 (anchor 5): context 0 .. 4
    for n in range(3):  # each block: its own two positions, both ways; padding: nothing else
        expected[2 * n : 2 * n + 2, 8 + 2 * n : 10 + 2 * n] = 1
    assert torch.equal(mask, expected)


def test_the_weights_decay_with_the_position_and_follow_the_loss_mask():
    torch.testing.assert_close(
        position_weights(4, 7.0), torch.tensor([0.0, 1.0, math.exp(-1 / 7), math.exp(-2 / 7)])
    )
    assert position_weights(4, None).tolist() == [0.0, 1.0, 1.0, 1.0]
    ids = torch.arange(10)[None]
    loss_mask = torch.ones(1, 10, dtype=torch.bool)
    loss_mask[0, 6] = False
    anchors = Anchors(torch.tensor([[4, 0]]), torch.tensor([[True, False]]))
    labels, weights = block_labels(ids, loss_mask, anchors, 4, 7.0)
    assert labels[0, 0].tolist() == [5, 6, 7]
    torch.testing.assert_close(weights[0, 0], torch.tensor([1.0, 0.0, math.exp(-2 / 7)]))
    assert (weights[0, 1] == 0).all()


def test_the_objective_drives_a_collated_batch_and_a_batch_with_nothing_to_learn(drafter):
    embed, lm_head = target_weights(drafter.cfg)
    objective = DFlashObjective(drafter, embed, lm_head, num_anchors=4, decay_gamma=GAMMA)
    loss, metrics = objective(random_batch(drafter.cfg, [24, 17]))
    loss.backward()
    assert torch.isfinite(loss) and metrics.blocks == 8
    assert (metrics.correct <= metrics.scored).all() and metrics.accepted <= 3 * metrics.blocks
    empty = random_batch(drafter.cfg, [6])
    loss, metrics = objective(empty)
    loss.backward()
    assert loss == 0 and metrics.blocks == 0


def test_the_objective_refuses_a_weight_of_another_shape(drafter):
    embed, lm_head = target_weights(drafter.cfg)
    with pytest.raises(ValueError, match=r"lm_head \(300, 32\)"):
        DFlashObjective(drafter, embed, lm_head[:, :32], num_anchors=4, decay_gamma=GAMMA)


def test_the_target_head_is_one_product_over_every_drafted_position(setup):
    """Every block's drafted positions go through the head [vocab, hidden] as rows of one matrix
    product, forward and backward. A product batched per block (what `@` makes of the 4-d slice
    of drafted positions) reads the whole head once per block: on an H100 at dflash's defaults it
    made the step several times slower than its products (docs/performance.md)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    drafter, batch, embed, lm_head, anchors = setup
    vocab = lm_head.shape[0]
    products = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            if func.__name__.split(".")[0] in ("mm", "bmm", "addmm") and any(
                vocab in s for s in shapes
            ):
                products.append((func.__name__.split(".")[0], shapes))
            return func(*args, **(kwargs or {}))

    with Products():
        library_loss(drafter, batch, embed, lm_head, anchors).backward()
    rows = int(anchors.positions.numel()) * (drafter.cfg.block_size - 1)
    assert [name for name, _ in products] == ["mm", "mm"], products  # forward, input gradient
    assert products[0][1] == [(rows, lm_head.shape[1]), (lm_head.shape[1], vocab)]
