"""DFlash speculative decoding with an in-process Hugging Face target, to measure a drafter as
SGLang's DFLASH worker runs it (srt/speculative/dflash_worker_v2.py `forward_batch_generation`,
read in 0.5.17):

- prefill: the target runs the prompt; the features of every prompt token (the layers
  `target_layer_ids` name, HF hidden_states[k + 1]) become the drafter's context, and the
  target's next token is the first generated one (worker lines 1392-1447);
- draft: a block of `block_size` tokens, the last accepted token (the one without features yet)
  then mask tokens, at positions L .. L + block_size - 1, L the number of tokens with features
  (lines 1547-1555); one drafter forward over the context and the block, the target's LM head over
  block positions 1 .. block_size - 1 gives the drafts (lines 1629-1649);
- verify: the target scores [last token, drafts], block_size tokens, in one forward; the longest
  prefix of drafts equal to its argmax is accepted, plus its next token (the bonus; lines
  1747-1810, dflash_utils.py `compute_dflash_correct_drafts_and_bonus`); the features of the last
  token and the accepted drafts join the context (commit_lens = accepted + 1, lines 1847-1866),
  a rejected draft's never do.

The loop, the target's KV cache of the accepted prefix, verification and the acceptance counts
(tau, per position) are the EAGLE-3 benchmark's (stages/drafter/speculate.py); `DFlashProposer`
is its Proposer for a DFlash drafter, so both families are measured by one loop and one
definition. At temperature > 0 each block position is sampled from the drafter's distribution
and verified by rejection sampling, as the EAGLE-3 benchmark does; SGLang drafts greedily at every
temperature (its draft sampler is an argmax) and accepts a draft with the target's probability of
it. Both emit the target's distribution; their acceptance rates differ.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..drafter.model import embed_tokens
from ..drafter.speculate import Proposal, SpecResult, choose, speculative_generate
from .model import DFlashDrafter

if TYPE_CHECKING:  # the class imports transformers' model loading, slow for a type hint
    from transformers import PreTrainedModel


class DFlashProposer:
    """Block drafting with a DFlashDrafter, through the target's embedding and LM head (the
    draft has neither of its own)."""

    def __init__(self, drafter: DFlashDrafter, embed: nn.Embedding | Tensor, lm_head: Tensor):
        self.drafter, self.embed, self.lm_head = drafter, embed, lm_head

    def block_logits(self, ids: Tensor, aux: Tensor, num_drafts: int) -> Tensor:
        """[num_drafts, vocab]: the drafter's logits for the tokens after `ids` [L + 1], from the
        features aux [1, L, num_features * H] of ids[:L]; ids[-1] opens the block."""
        d = self.drafter
        block = torch.full((1, num_drafts + 1), d.cfg.mask_token_id, device=aux.device)
        block[0, 0] = ids[-1]
        positions = aux.shape[1] + torch.arange(num_drafts + 1, device=aux.device)[None]
        dtype = d.fc.weight.dtype
        hidden = d(embed_tokens(self.embed, block).to(dtype), positions, aux.to(dtype))
        return hidden[0, 1:] @ self.lm_head.to(hidden.dtype).T

    @torch.no_grad()
    def propose(
        self,
        ids: Tensor,
        aux: Tensor,
        num_steps: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Proposal:
        """`num_steps` drafts after `ids` [L + 1] in one block of num_steps + 1 tokens; `aux`
        holds the features of ids[:L]."""
        if aux.shape[1] != ids.numel() - 1:
            raise ValueError(
                f"DFlashProposer: features of {aux.shape[1]} tokens for {ids.numel()} ids; the "
                "context is every id but the last"
            )
        logits = self.block_logits(ids, aux, num_steps)
        picks = [choose(row, temperature, generator) for row in logits]
        probs = [q for _, q in picks if q is not None]
        return Proposal([index for index, _ in picks], torch.stack(probs) if probs else None)


@torch.no_grad()
def dflash_generate(
    target: PreTrainedModel,
    drafter: DFlashDrafter,
    prompt_ids: Sequence[int] | Tensor,
    max_new_tokens: int,
    temperature: float = 0.0,
    stop_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    block_size: int | None = None,
) -> SpecResult:
    """Generate with DFlash speculation; at temperature 0 the output is the target's greedy
    output. block_size: tokens verified per step (SGLang's --speculative-num-draft-tokens);
    None: the drafter's own. The result counts block_size - 1 drafts per verify step."""
    size = drafter.cfg.block_size if block_size is None else block_size
    if size < 2:
        raise ValueError(
            f"dflash_generate: block_size {size}; a block drafts block_size - 1 tokens"
        )
    proposer = DFlashProposer(drafter, *embedding_and_head(target))
    return speculative_generate(
        target,
        proposer,
        None,
        prompt_ids,
        max_new_tokens,
        num_steps=size - 1,
        temperature=temperature,
        stop_ids=stop_ids,
        generator=generator,
        aux_indices=drafter.cfg.hf_indices,
    )


def embedding_and_head(target: PreTrainedModel) -> tuple[nn.Embedding, Tensor]:
    """The target's token embedding and LM head weight, which the drafter borrows."""
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    if not isinstance(embed, nn.Embedding) or not isinstance(head, nn.Linear):
        raise ValueError(
            f"{type(target).__name__}: the DFlash drafter needs a plain embedding and a linear "
            f"LM head, got {type(embed).__name__} and {type(head).__name__}"
        )
    return embed, head.weight
