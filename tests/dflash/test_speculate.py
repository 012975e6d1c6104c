"""DFlash speculation in process: the target's own greedy output whatever the drafter, tau and
per-position acceptance counted as for EAGLE-3, and a context that holds accepted tokens only."""

from __future__ import annotations

import pytest
import torch

from stages.dflash.objective import Anchors, block_tokens, block_visibility
from stages.dflash.speculate import DFlashProposer, dflash_generate, embedding_and_head
from stages.drafter.speculate import acceptance_stats, speculative_generate
from tests.drafter.test_speculate import greedy
from tests.mla_target import build_target, deepseek_config
from tests.tiny_llama import VOCAB

from .conftest import make_drafter

PROMPTS = [[5, 17, 42, 8], [100, 3, 250, 77, 12, 9]]
BLOCK = 4  # make_drafter's block_size


def features(target, ids: torch.Tensor, hf_indices) -> torch.Tensor:
    """[1, T, features] of `ids` [T] by a full forward, no cache."""
    with torch.no_grad():
        out = target(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i] for i in hf_indices], dim=-1)


class TargetAsDrafter(DFlashProposer):
    """A drafter double whose logits are the target's greedy continuation; `wrong_from` (a draft
    position, 1-based) spoils that draft and every later one."""

    def __init__(self, target, drafter, wrong_from: int | None = None):
        super().__init__(drafter, *embedding_and_head(target))
        self.target, self.wrong_from = target, wrong_from

    def block_logits(self, ids, aux, num_drafts):
        tokens = torch.tensor(greedy(self.target, ids.tolist(), num_drafts))
        if self.wrong_from is not None:
            spoiled = tokens[self.wrong_from - 1 :]
            tokens[self.wrong_from - 1 :] = (spoiled + 1) % self.lm_head.shape[0]
        return torch.nn.functional.one_hot(tokens, self.lm_head.shape[0]).float()


class ContextRecorder(DFlashProposer):
    """The real proposer, recording the accepted ids and the context features of each round."""

    def __init__(self, target, drafter):
        super().__init__(drafter, *embedding_and_head(target))
        self.rounds: list[tuple[torch.Tensor, torch.Tensor]] = []

    def propose(self, ids, aux, *args):
        self.rounds.append((ids.clone(), aux.clone()))
        return super().propose(ids, aux, *args)


def test_a_block_is_drafted_as_training_scores_it(target, drafter):
    """The block after L accepted tokens with features is the training block anchored at L: the
    same token, positions and context, so the same logits."""
    ids = torch.tensor(PROMPTS[1] + greedy(target, PROMPTS[1], 6))
    aux = features(target, ids, drafter.cfg.hf_indices)
    embed, lm_head = embedding_and_head(target)
    anchor = 8
    anchors = Anchors(torch.tensor([[anchor]]), torch.tensor([[True]]))
    block, positions = block_tokens(ids[None], anchors, BLOCK, drafter.cfg.mask_token_id)
    visible = block_visibility(anchors, BLOCK)
    with torch.no_grad():
        trained = drafter(embed(block), positions, aux, visible)[0, 1:] @ lm_head.T
        drafted = DFlashProposer(drafter, embed, lm_head).block_logits(
            ids[: anchor + 1], aux[:, :anchor], BLOCK - 1
        )
    torch.testing.assert_close(drafted, trained, atol=1e-5, rtol=1e-5)


def test_greedy_output_is_the_targets_whatever_the_drafter(target, drafter):
    for prompt in PROMPTS:
        result = dflash_generate(target, drafter, prompt, max_new_tokens=16)
        assert result.output_ids == greedy(target, prompt, 16)
        assert result.num_steps == BLOCK - 1 and result.verify_steps > 0
    reference = greedy(target, PROMPTS[0], 16)
    stopped = dflash_generate(target, drafter, PROMPTS[0], 16, stop_ids=[reference[6]])
    assert stopped.output_ids == reference[: reference.index(reference[6]) + 1]


def test_a_served_block_size_other_than_the_trained_one_keeps_the_output(target, drafter):
    result = dflash_generate(target, drafter, PROMPTS[1], max_new_tokens=12, block_size=7)
    assert result.output_ids == greedy(target, PROMPTS[1], 12)
    assert result.num_steps == 6 and len(result.accepted_per_position) == 6


def test_greedy_output_is_the_targets_on_a_deepseek_v3_target():
    config = deepseek_config("tiny")
    target = build_target(config)
    drafter = make_drafter(config).eval()
    prompt = [7, 1500, 33, 980, 4]
    result = dflash_generate(target, drafter, prompt, max_new_tokens=12)
    assert result.output_ids == greedy(target, prompt, 12)


def test_tau_is_tokens_per_verify_step_between_one_and_the_block_size(target, drafter):
    results = [dflash_generate(target, drafter, p, max_new_tokens=20) for p in PROMPTS]
    stats = acceptance_stats(results)
    steps = sum(r.verify_steps for r in results)
    assert stats.tau == sum(len(r.output_ids) - 1 for r in results) / steps
    assert 1 <= stats.tau <= BLOCK
    assert stats.verify_steps == steps


def test_a_drafter_that_predicts_the_target_gets_tau_block_size(target, drafter):
    """Every draft accepted: block_size tokens per verify step, each position reached by every
    step; spoiled from the third draft on, exactly two drafts per step."""
    steps = 4
    exact = [
        speculative_generate(
            target,
            TargetAsDrafter(target, drafter),
            None,
            prompt,
            max_new_tokens=1 + steps * BLOCK,
            num_steps=BLOCK - 1,
            aux_indices=drafter.cfg.hf_indices,
        )
        for prompt in PROMPTS
    ]
    assert [r.output_ids for r in exact] == [greedy(target, p, 1 + steps * BLOCK) for p in PROMPTS]
    assert all(r.accepted == [BLOCK - 1] * steps for r in exact)
    stats = acceptance_stats(exact)
    assert stats.tau == BLOCK and stats.unconditional == [1.0, 1.0, 1.0]
    spoiled = speculative_generate(
        target,
        TargetAsDrafter(target, drafter, wrong_from=3),
        None,
        PROMPTS[0],
        max_new_tokens=1 + steps * 3,
        num_steps=BLOCK - 1,
        aux_indices=drafter.cfg.hf_indices,
    )
    assert spoiled.accepted == [2] * steps and spoiled.accepted_per_position == [4, 4, 0]
    assert acceptance_stats([spoiled]).tau == 3


def test_the_context_grows_by_the_accepted_tokens_only(target, drafter):
    """Each round the drafter sees the features of exactly the accepted tokens but the last (as
    a fresh forward computes them), and the ids grow by the accepted drafts plus the bonus."""
    recorder = ContextRecorder(target, drafter)
    result = speculative_generate(
        target,
        recorder,
        None,
        PROMPTS[1],
        max_new_tokens=24,
        num_steps=BLOCK - 1,
        aux_indices=drafter.cfg.hf_indices,
    )
    assert sum(result.accepted) < (BLOCK - 1) * result.verify_steps  # some drafts were rejected
    for ids, aux in recorder.rounds:
        assert aux.shape[1] == ids.numel() - 1
        fresh = features(target, ids[:-1], drafter.cfg.hf_indices)
        torch.testing.assert_close(aux, fresh, atol=1e-5, rtol=1e-5)
    lengths = [ids.numel() for ids, _ in recorder.rounds]
    grown = [after - before for before, after in zip(lengths, lengths[1:])]
    assert grown == [n + 1 for n in result.accepted[:-1]]
    final_ids = recorder.rounds[-1][0].tolist()
    assert final_ids == PROMPTS[1] + result.output_ids[: len(final_ids) - len(PROMPTS[1])]


def test_sampled_drafts_carry_their_distribution_and_a_seed_repeats_a_run(target, drafter):
    """At temperature > 0 each draft comes with the distribution it was sampled from (what the
    rejection sampling divides by); a seeded run repeats."""
    ids = torch.tensor(PROMPTS[0])
    aux = features(target, ids[:-1], drafter.cfg.hf_indices)
    proposer = DFlashProposer(drafter, *embedding_and_head(target))
    proposal = proposer.propose(ids, aux, BLOCK - 1, 0.8, torch.Generator().manual_seed(0))
    assert proposal.probs is not None and proposal.probs.shape == (BLOCK - 1, VOCAB)
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(BLOCK - 1))
    assert all(proposal.probs[j, token] > 0 for j, token in enumerate(proposal.tokens))
    seeded = [torch.Generator().manual_seed(3) for _ in range(2)]
    runs = [dflash_generate(target, drafter, ids, 12, 0.8, generator=g) for g in seeded]
    assert runs[0] == runs[1] and len(runs[0].output_ids) == 12


def test_features_of_another_length_are_refused(target, drafter):
    proposer = DFlashProposer(drafter, *embedding_and_head(target))
    ids = torch.tensor(PROMPTS[0])
    with pytest.raises(ValueError, match="features of 4 tokens for 4 ids"):
        proposer.propose(ids, features(target, ids, drafter.cfg.hf_indices), BLOCK - 1, 0.0, None)
