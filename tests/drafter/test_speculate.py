import pytest
import torch
from transformers import LlamaForCausalLM

from stages.drafter.model import Eagle3Config, Eagle3Drafter
from stages.drafter.speculate import (
    CachedTarget,
    Eagle3Proposer,
    Proposal,
    SpecResult,
    acceptance_stats,
    speculative_generate,
    verify_proposal,
)

from .conftest import VOCAB, features

AUX = [2, 4, 5]


@torch.no_grad()
def greedy(target, prompt, max_new_tokens, stop=()):
    seq, out = torch.tensor(prompt), []
    while len(out) < max_new_tokens:
        token = int(target(seq[None], use_cache=False).logits[0, -1].argmax())
        out.append(token)
        seq = torch.cat([seq, torch.tensor([token])])
        if token in stop:
            break
    return out


class OracleProposer:
    """Proposes the target's own greedy continuation: every draft must be accepted."""

    def __init__(self, target):
        self.target = target

    @torch.no_grad()
    def propose(self, ids, aux, num_steps, temperature, generator):
        tokens = greedy(self.target, ids.tolist(), num_steps)
        return Proposal(tokens, None)


class RandomProposer:
    def propose(self, ids, aux, num_steps, temperature, generator):
        tokens = torch.randint(0, VOCAB, (num_steps,), generator=generator).tolist()
        return Proposal(tokens, torch.full((num_steps, VOCAB), 1.0 / VOCAB))


PROMPTS = [[5, 17, 42, 8], [100, 3, 250, 77, 12, 9]]


class FeatureCheckingProposer(Eagle3Proposer):
    """Checks that each round hands the drafter the target features of all but the last id."""

    def __init__(self, target, drafter):
        super().__init__(drafter, target.model.embed_tokens)
        self.target, self.rounds = target, 0

    def propose(self, ids, aux, *args):
        fresh, _ = features(self.target, ids[None, :-1], AUX)
        torch.testing.assert_close(aux, fresh, atol=1e-5, rtol=1e-5)
        self.rounds += 1
        return super().propose(ids, aux, *args)


@pytest.mark.slow
def test_output_equals_the_targets_greedy_output(target, drafter):
    for prompt in PROMPTS:
        proposer = FeatureCheckingProposer(target, drafter)
        result = speculative_generate(
            target, proposer, None, prompt, max_new_tokens=16, num_steps=3, aux_indices=AUX
        )
        assert result.output_ids == greedy(target, prompt, 16)
        assert proposer.rounds == result.verify_steps > 0
    reference = greedy(target, PROMPTS[0], 16)
    stop = reference[6]
    stopped = speculative_generate(
        target, drafter, target.model.embed_tokens, PROMPTS[0], max_new_tokens=16, stop_ids=[stop]
    )
    assert stopped.output_ids == reference[: reference.index(stop) + 1]


def test_the_cached_target_after_dropping_rejected_drafts_scores_as_a_full_forward(target):
    """Prefill, a verify step over four drafts, two of them kept: the next step's logits and
    features are those of a fresh forward over the whole accepted sequence."""
    ids = torch.tensor(PROMPTS[1] + [41, 7, 99, 5, 63, 21])
    cached = CachedTarget(target, AUX)
    cached.forward(ids[:6])
    cached.forward(ids[:11])  # the last prompt id and four drafts
    cached.keep(8)  # two drafts accepted; the rest dropped
    assert cached.cached == 8
    logits, aux = cached.forward(ids)
    full_aux, full_logits = features(target, ids[None], AUX)
    torch.testing.assert_close(logits, full_logits[0, 8:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, full_aux[:, 8:], atol=1e-5, rtol=1e-5)


def test_oracle_drafter_is_always_accepted(target):
    results = [
        speculative_generate(
            target,
            OracleProposer(target),
            None,
            prompt,
            max_new_tokens=1 + 4 * 3,
            num_steps=3,
            aux_indices=AUX,
        )
        for prompt in PROMPTS
    ]
    assert [r.output_ids for r in results] == [greedy(target, p, 13) for p in PROMPTS]
    stats = acceptance_stats(results)
    assert stats.tau == 4.0 and stats.verify_steps == 6
    assert stats.conditional == stats.unconditional == [1.0, 1.0, 1.0]


def test_random_drafter_gives_tau_about_one(target):
    g = torch.Generator().manual_seed(0)
    results = [
        speculative_generate(
            target, RandomProposer(), None, prompt, max_new_tokens=25, generator=g, aux_indices=AUX
        )
        for prompt in PROMPTS
    ]
    stats = acceptance_stats(results)
    assert 1.0 <= stats.tau < 1.1
    assert stats.unconditional[0] < 0.1


@pytest.mark.slow
def test_sampled_verification_keeps_the_target_distribution():
    """Draft from q, accept with min(1, p/q), else resample max(0, p - q): the token emitted
    first is distributed as p."""
    g = torch.Generator().manual_seed(0)
    p_logits = torch.tensor([[1.0, 0.2, -1.0, 0.5, 0.0], [0.0] * 5])
    q = torch.tensor([0.05, 0.6, 0.2, 0.05, 0.1])
    trials, counts = 10000, torch.zeros(5)
    drafts = torch.multinomial(q, trials, replacement=True, generator=g)
    for x in drafts.tolist():
        n, correction = verify_proposal(p_logits, Proposal([x], q[None]), 1.0, g)
        counts[x if n == 1 else correction] += 1
    torch.testing.assert_close(counts / trials, p_logits[0].softmax(-1), atol=0.02, rtol=0)


def test_sampling_is_reproducible_and_runs_with_the_drafter(target, drafter):
    runs = [
        speculative_generate(
            target,
            drafter,
            target.model.embed_tokens,
            PROMPTS[0],
            max_new_tokens=12,
            temperature=0.8,
            generator=torch.Generator().manual_seed(3),
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and len(runs[0].output_ids) == 12


def test_acceptance_stats_pool_results():
    results = [SpecResult([1] * 8, [3, 0, 2], 3), SpecResult([1] * 3, [1], 3)]
    stats = acceptance_stats(results)
    assert stats.tau == pytest.approx(9 / 4)
    assert results[0].accepted_per_position == [2, 2, 1]
    assert stats.unconditional == [3 / 4, 2 / 4, 1 / 4]
    assert stats.conditional == [3 / 4, 2 / 3, 1 / 2]
    with pytest.raises(ValueError, match="mix num_steps"):
        acceptance_stats([SpecResult([1], [], 3), SpecResult([1], [], 4)])


def test_greedy_equality_on_the_real_tiny_llama(stories_path):
    target = LlamaForCausalLM.from_pretrained(stories_path, local_files_only=True).eval()
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.from_target(target.config, 64, [1, 2, 3])).eval()
    prompt = [1, 403, 407, 262, 370]
    result = speculative_generate(
        target, drafter, target.model.embed_tokens, prompt, max_new_tokens=16, num_steps=4
    )
    assert result.output_ids == greedy(target, prompt, 16)
