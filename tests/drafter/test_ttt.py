import pytest
import torch
import torch.nn.functional as F

from stages.drafter.model import DraftStep, Eagle3Drafter
from stages.drafter.ttt import (
    SoftLabels,
    TTTMetrics,
    drafted,
    replay_counts,
    shift_left,
    shifted_soft_cross_entropy,
    soft_labels,
    step_metrics,
    ttt_forward,
    ttt_unroll,
    valid_positions,
)

from .conftest import HIDDEN, VOCAB, features, make_drafter

T = 6


def labels_all_in_vocab(batch=1):
    return SoftLabels(
        torch.zeros(batch, T, 4),
        torch.zeros(batch, T, dtype=torch.long),
        torch.ones(batch, T, dtype=torch.bool),
    )


def test_valid_pairs_on_a_six_token_example():
    # Tokens 0-1 are the prompt, 2-5 the supervised answer, except token 3.
    loss_mask = torch.tensor([[0, 0, 1, 0, 1, 1]])
    valid = valid_positions(labels_all_in_vocab(), loss_mask, None, ttt_steps=4)
    # Step k at position i predicts token i + 2 + k.
    assert [v[0].int().tolist() for v in valid] == [
        [1, 0, 1, 1, 0, 0],  # step 0: tokens 2, (3), 4, 5
        [0, 1, 1, 0, 0, 0],  # step 1: tokens (3), 4, 5
        [1, 1, 0, 0, 0, 0],  # step 2: tokens 4, 5
        [1, 0, 0, 0, 0, 0],  # step 3: token 5
    ]


def test_padding_and_outside_vocab_targets_are_masked():
    labels = labels_all_in_vocab()
    labels.in_vocab[0, 3] = False  # the target's choice at position 3 (token 4)
    loss_mask = torch.ones(1, T, dtype=torch.long)
    attention = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)  # token 5 is padding
    valid = valid_positions(labels, loss_mask, attention, ttt_steps=3)
    assert [v[0].int().tolist() for v in valid] == [
        [1, 1, 0, 0, 0, 0],  # tokens 2, 3 (4 is outside the draft vocab, 5 is padding)
        [1, 0, 0, 0, 0, 0],  # token 3 (4 outside the vocab)
        [0, 0, 0, 0, 0, 0],  # token 4 outside the vocab
    ]


class ScriptedDrafter(Eagle3Drafter):
    """Predicts, at step k and position i, the draft id `answer(i, k)`; records its inputs."""

    def __init__(self, cfg, answer):
        super().__init__(cfg)
        self.answer, self.embeds = answer, []

    def step(self, embeds, hidden, kv=None, key_mask=None):
        k = len(self.embeds)
        self.embeds.append(embeds)
        index = torch.tensor([self.answer(i, k) for i in range(embeds.shape[1])])
        logits = 50.0 * F.one_hot(index, self.cfg.draft_vocab_size).float()[None]
        return DraftStep(logits.expand(embeds.shape[0], -1, -1), hidden, kv)


def test_step_k_at_position_i_learns_the_target_at_i_plus_1_plus_k(drafter):
    # The target's choice at position t is draft id t (and its target id is in the vocab).
    draft_ids = drafter.draft_ids()
    target_logits = torch.full((1, T, VOCAB), -20.0)
    target_logits[0, torch.arange(T), draft_ids[:T]] = 20.0
    input_ids = torch.arange(10, 10 + T)[None]
    embed = torch.randn(VOCAB, HIDDEN)
    aux = torch.randn(1, T, 3 * HIDDEN)
    loss_mask = torch.ones(1, T)

    right = ScriptedDrafter(drafter.cfg, lambda i, k: min(i + 1 + k, T - 1))
    right.set_vocab(drafter.d2t, drafter.t2d)
    loss, metrics = ttt_forward(right, embed, aux, target_logits, input_ids, loss_mask, ttt_steps=3)
    assert metrics.accuracy == [1.0, 1.0, 1.0]
    assert metrics.valid.tolist() == [4, 3, 2]
    assert metrics.acceptance_unconditional == [1.0, 1.0, 1.0]
    # One span of tokens 0-5; tokens 0 and 1 are known, rounds draft tokens 2-5: chain 1 in rounds
    # (2, 3) and (4, 5), chain 2 in (2, 3, 4) and (5), chain 3 in one round.
    assert metrics.replay_tokens.tolist() == [4, 4, 4]
    assert metrics.replayed_tau == [2.0, 2.0, 4.0]
    assert loss.item() < 1e-6
    for k, embeds in enumerate(right.embeds):  # step k at position i reads token i + 1 + k
        n = T - 1 - k
        torch.testing.assert_close(embeds[0, :n], embed[input_ids[0, 1 + k :]])

    late = ScriptedDrafter(drafter.cfg, lambda i, k: min(i + 2 + k, T - 1))
    late.set_vocab(drafter.d2t, drafter.t2d)
    loss, metrics = ttt_forward(late, embed, aux, target_logits, input_ids, loss_mask, ttt_steps=3)
    assert metrics.accuracy == [0.0, 0.0, 0.0]
    assert metrics.replayed_tau == [1.0, 1.0, 1.0]
    assert loss.item() > 10


def test_a_target_choice_outside_the_draft_vocab_is_a_rejected_draft(drafter):
    # As above, but the target's choice at position 3 is an id the draft vocabulary lacks:
    # serving rejects every draft there, so acceptance counts it as a miss (the loss skips it).
    draft_ids = drafter.draft_ids()
    target_logits = torch.full((1, T, VOCAB), -20.0)
    target_logits[0, torch.arange(T), draft_ids[:T]] = 20.0
    target_logits[0, 3, int((~drafter.t2d).nonzero()[0])] = 30.0
    right = ScriptedDrafter(drafter.cfg, lambda i, k: min(i + 1 + k, T - 1))
    right.set_vocab(drafter.d2t, drafter.t2d)
    loss, metrics = ttt_forward(
        right,
        torch.randn(VOCAB, HIDDEN),
        torch.randn(1, T, 3 * HIDDEN),
        target_logits,
        torch.arange(10, 10 + T)[None],
        torch.ones(1, T),
        ttt_steps=3,
    )
    assert metrics.valid.tolist() == [3, 2, 1] and metrics.accuracy == [1.0, 1.0, 1.0]
    assert loss.item() < 1e-6
    # chains from positions 0..3: position 2 misses at step 0, 1 at step 1, 0 at step 2
    assert metrics.chain_valid.tolist() == [4, 3, 2]
    assert metrics.acceptance_unconditional == [0.75, 1 / 3, 0.0]
    assert metrics.acceptance_conditional == [0.75, 0.5, 0.0]
    # serving: the round at 0 accepts tokens 2, 3 and takes 4 from the target (its draft of
    # token 4 was the miss), the round at 3 yields token 5
    assert metrics.replay_rounds[2] == 2 and metrics.replayed_tau[2] == 2.0


def test_loss_is_the_decayed_mean_over_valid_positions(target, drafter):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 9))
    aux, logits = features(target, ids, drafter.cfg.aux_layer_ids)
    loss_mask = torch.ones_like(ids)
    loss_mask[:, :3] = 0
    attention = torch.ones_like(ids, dtype=torch.bool)
    attention[1, 7:] = False
    # Make the target's choice at one position fall outside the draft vocabulary.
    outside = int((~drafter.t2d).nonzero()[0])
    logits[0, 4, outside] = 1e3
    loss, metrics = ttt_forward(
        drafter,
        target.model.embed_tokens,
        aux,
        logits,
        ids,
        loss_mask,
        attention,
        ttt_steps=3,
        decay=0.5,
    )

    draft_logits = ttt_unroll(drafter, target.model.embed_tokens, aux, ids, attention, 3)
    labels = soft_labels(logits, drafter)
    valid = valid_positions(labels, loss_mask, attention, 3)
    assert not valid[0][0, 3] and not valid[1][0, 2]  # both would learn position 4
    expected = 0.0
    for k in range(3):
        p = shift_left(labels.probs, k + 1, 0.0)[valid[k]]
        ce = -(p * F.log_softmax(draft_logits[k][valid[k]], -1)).sum(-1)
        expected += 0.5**k * ce.mean()
        assert metrics.valid[k] == valid[k].sum()
        hits = draft_logits[k].argmax(-1) == shift_left(labels.argmax, k + 1, -1)
        assert metrics.correct[k] == (hits & valid[k]).sum()
    torch.testing.assert_close(loss, expected)
    # The masked position's target does not enter the loss.
    logits2 = logits.clone()
    logits2[0, 4, drafter.draft_ids()] += torch.randn(drafter.cfg.draft_vocab_size)
    loss2, _ = ttt_forward(
        drafter,
        target.model.embed_tokens,
        aux,
        logits2,
        ids,
        loss_mask,
        attention,
        ttt_steps=3,
        decay=0.5,
    )
    torch.testing.assert_close(loss2, loss)


def test_drafted_is_the_argmax_but_on_the_batch_tail_the_loss_leaves_out():
    logits = torch.randn(2, 5, 7)
    for shift in (1, 3, 10, 12):
        choice = drafted(logits, shift).flatten()
        kept = max(10 - shift, 0)
        assert torch.equal(choice[:kept], logits.argmax(-1).flatten()[:kept])
        assert (choice[kept:] == -1).all() and choice.shape == (10,)


def test_soft_labels_from_final_hidden_state_equal_those_from_logits(target, drafter):
    ids = torch.randint(0, VOCAB, (2, 7))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    from_logits = soft_labels(out.logits, drafter)
    from_last = soft_labels(out.hidden_states[-1], drafter, target.lm_head.weight, chunk=3)
    torch.testing.assert_close(from_last.probs, from_logits.probs)
    assert torch.equal(from_last.in_vocab, from_logits.in_vocab)
    with pytest.raises(ValueError, match="lm_head"):
        soft_labels(out.hidden_states[-1], drafter)


def test_gradient_reaches_every_drafter_parameter_and_nothing_else(target, target_config):
    drafter = make_drafter(target_config).train()
    ids = torch.randint(0, VOCAB, (2, 8))
    aux, logits = features(target, ids, drafter.cfg.aux_layer_ids)
    aux.requires_grad_(True)
    embed = torch.nn.Embedding.from_pretrained(
        target.model.embed_tokens.weight.clone(), freeze=False
    )
    # Every target choice inside the draft vocabulary, so every position is scored.
    logits[..., drafter.draft_ids()] += 1e3
    loss, _ = ttt_forward(drafter, embed, aux, logits, ids, torch.ones_like(ids), ttt_steps=3)
    loss.backward()
    assert embed.weight.grad is None and aux.grad is None
    for name, p in drafter.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shift", [1, 2, 4, 8, 9, 12])
def test_the_fused_loss_equals_the_plain_soft_cross_entropy(dtype, shift, traced, monkeypatch):
    """Values and gradients against -(shift_left(p) * log_softmax(z.float())).sum(-1), over two
    samples (whose rows must not pair across the boundary), shifts at and past the end; both
    the eager Function and the form a compiled caller traces (`traced`)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: traced)
    g = torch.Generator().manual_seed(shift)
    logits = (4 * torch.randn(2, 9, 17, generator=g)).to(dtype).requires_grad_(True)
    probs = torch.randn(2, 9, 17, generator=g).softmax(-1)
    weights = torch.randn(2, 9, generator=g)
    ce = shifted_soft_cross_entropy(logits, probs, shift)
    (grad,) = torch.autograd.grad((ce * weights).sum(), logits)
    plain = -(shift_left(probs, shift, 0.0) * F.log_softmax(logits.float(), -1)).sum(-1)
    (plain_grad,) = torch.autograd.grad((plain * weights).sum(), logits)
    assert ce.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(ce, plain, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad, plain_grad, rtol=1e-6, atol=1e-6)
    assert (ce[:, 9 - min(shift, 9) :] == 0).all()


@pytest.mark.slow
def test_the_loss_kernels_compile_once_for_every_shift_and_length():
    """What a GPU runs, compiled here by the CPU backend: the same values as eager, and one
    graph serving every TTT shift and row count (no recompilation per step or batch)."""
    import torch._dynamo

    from stages.drafter.ttt import _ce_rows, _ce_rows_grad

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    rows, rows_grad = (
        torch.compile(_ce_rows, dynamic=True),
        torch.compile(_ce_rows_grad, dynamic=True),
    )
    g = torch.Generator().manual_seed(0)
    for n, shift in [(40, 2), (40, 3), (24, 5), (70, 7)]:
        logits = torch.randn(n, 19, generator=g).bfloat16()
        probs = torch.randn(n, 19, generator=g).softmax(-1)
        ce, lse = rows(logits, probs, shift)
        torch.testing.assert_close((ce, lse), _ce_rows(logits, probs, shift))
        grad_ce = torch.randn(n, generator=g)
        torch.testing.assert_close(
            rows_grad(logits, probs, lse, grad_ce, shift),
            _ce_rows_grad(logits, probs, lse, grad_ce, shift),
        )
    assert counts["stats"]["unique_graphs"] == 2, dict(counts["stats"])


def test_under_bf16_autocast_activations_stay_bf16_and_the_step_matches_float32(
    target, target_config
):
    """What a GPU runs (bf16 autocast over float32 master weights), here on the CPU: every draft
    step's logits and hidden states are bf16 (no float32 copies between layers), and the loss
    and every gradient agree with the float32 step to bf16's precision."""
    drafter = make_drafter(target_config).train()
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(5))
    aux, logits = features(target, ids, drafter.cfg.aux_layer_ids)
    logits[..., drafter.draft_ids()] += 4.0  # most target choices inside the draft vocabulary
    embed = target.model.embed_tokens.weight.detach()
    seen: list[torch.dtype] = []
    drafter.midlayer.register_forward_hook(lambda m, args, out: seen.append(out[0].dtype))
    drafter.midlayer.mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].dtype))
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        drafter.zero_grad(set_to_none=True)
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss, _ = ttt_forward(drafter, embed, aux.to(dtype), logits, ids, torch.ones_like(ids))
        loss.backward()
        assert len(seen) == 2 * 7 and set(seen) == {dtype}
        results[dtype] = loss.detach(), {n: q.grad.clone() for n, q in drafter.named_parameters()}
    (loss32, grads32), (loss16, grads16) = results[torch.float32], results[torch.bfloat16]
    torch.testing.assert_close(loss16, loss32, rtol=2e-2, atol=0)
    for name, grad in grads32.items():
        relative = (grads16[name] - grad).norm() / grad.norm()
        assert relative < 5e-2, (name, float(relative))


def test_metrics_count_chains_and_add_up():
    def bools(rows):
        return [torch.tensor([r], dtype=torch.bool) for r in rows]

    valid = bools([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    correct = bools([[1, 1, 0, 1], [1, 0, 1, 1], [0, 1, 1, 1]])
    ce = [torch.ones(1, 4)] * 3
    m = step_metrics(ce, correct, valid, valid, torch.ones(1, 4, dtype=torch.bool))
    assert m.accuracy == [0.75, 2 / 3, 0.5]
    # chains: position 0 matches at steps 0,1 then fails; position 1 fails at step 1.
    assert m.acceptance_unconditional == [0.75, 1 / 3, 0.0]
    assert m.acceptance_conditional == [0.75, 0.5, 0.0]
    both = m + m
    assert isinstance(both, TTTMetrics) and both.accuracy == m.accuracy
    assert both.valid.tolist() == [8, 6, 4]
    # tokens 2 and 3 in one round at position 0, whatever the chain
    assert m.replayed_tau == [2.0, 2.0, 2.0] and both.replay_rounds.tolist() == [2, 2, 2]
    assert m.as_dict()["valid_positions"] == [4, 3, 2]


def steps(*rows):
    """[B, T] bool tensors, one per step, from each step's rows of 0/1."""
    return [torch.tensor(r, dtype=torch.bool) for r in rows]


def test_replay_counts_rounds_by_hand_and_restarts_at_each_span():
    # Spans: tokens 1-5 and 7-11 (token 6 is the template's, 12 unsupervised). Each span's first
    # token comes from the prefill; a round at i drafts from token i + 2. Misses: step 1 at 0.
    supervised = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    hit = [1] * 13
    correct = steps([hit], [[0] + hit[1:]], [hit])
    tokens, rounds = replay_counts(correct, supervised)
    assert tokens.tolist() == [8, 8, 8]  # tokens 2-5 and 8-11
    # chain 1: (2, 3) (4, 5) | (8, 9) (10, 11)
    # chain 2: (2, 3: step 1 missed) (4, 5: all that is left) | (8, 9, 10) (11)
    # chain 3: (2, 3) at 0, then at 2 three accepted would reach position 6, the next span's first
    # round: the span ends instead (4, 5) | (8, 9, 10, 11)
    assert rounds.tolist() == [4, 4, 3]


def test_replayed_tau_of_a_perfect_and_of_a_wrong_drafter():
    # One span of tokens 1-13: 12 rounds' tokens (2-13), 3 chain steps.
    supervised = torch.ones(1, 14, dtype=torch.bool)
    supervised[0, 0] = False
    right = [torch.ones(1, 14, dtype=torch.bool)] * 3
    wrong = [torch.zeros(1, 14, dtype=torch.bool)] * 3
    for correct, tau in ((right, [2.0, 3.0, 4.0]), (wrong, [1.0, 1.0, 1.0])):
        tokens, rounds = replay_counts(correct, supervised)
        assert (tokens / rounds).tolist() == tau


def serving_walk(correct: list[list[bool]], supervised: list[bool]) -> tuple[int, int]:
    """(tokens, rounds) of one row for a chain of len(correct), walked round by round."""
    tokens = rounds = 0
    t = 0
    while t < len(supervised):
        if not supervised[t]:
            t += 1
            continue
        end = t
        while end < len(supervised) and supervised[end]:
            end += 1
        known = t + 1 if t else 2  # the prefill gives a span's first token (two at position 0)
        while known < end:
            accepted = 0
            while accepted < len(correct) and correct[accepted][known - 2]:
                accepted += 1
            made = min(accepted + 1, end - known)
            tokens, rounds, known = tokens + made, rounds + 1, known + made
        t = end
    return tokens, rounds


def test_replay_counts_equal_a_round_by_round_walk_and_batches_add_up():
    g = torch.Generator().manual_seed(0)
    rows, width, k = 6, 40, 4
    supervised = torch.rand(rows, width, generator=g) < 0.8
    supervised[:, :3] = False
    supervised[2, 0] = True  # a span at the very start of a row
    supervised[3, 20:] = False  # padding
    correct = [torch.rand(rows, width, generator=g) < 0.7 for _ in range(k)]
    tokens, rounds = replay_counts(correct, supervised)
    for chain in range(1, k + 1):
        walks = [
            serving_walk([c[b].tolist() for c in correct[:chain]], supervised[b].tolist())
            for b in range(rows)
        ]
        assert (tokens[chain - 1], rounds[chain - 1]) == tuple(map(sum, zip(*walks)))
    first = replay_counts([c[:2] for c in correct], supervised[:2])
    rest = replay_counts([c[2:] for c in correct], supervised[2:])
    assert torch.equal(first[0] + rest[0], tokens) and torch.equal(first[1] + rest[1], rounds)
