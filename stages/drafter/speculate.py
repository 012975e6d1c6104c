"""Chain speculative decoding with an in-process Hugging Face target, to measure a drafter.

The target keeps a KV cache of the accepted prefix (`CachedTarget`): each verify step runs only
the tokens the cache lacks, and the rejected drafts' entries are dropped after it. One round:

1. the drafter reads the target features of the accepted prefix and drafts `num_steps` tokens
   (greedy at temperature 0, sampled from its own distribution otherwise);
2. one target forward scores prefix + drafts; drafts are accepted while they match (temperature
   0: the target's argmax; otherwise speculative rejection sampling, min(1, p / q), resampling
   from norm(max(0, p - q)) on rejection), and one more token comes from the target (the bonus).

The first generated token comes from the target's prefill, before any draft exists, so it is not
part of a verify step: tau here is (generated tokens - 1) / verify steps. SGLang's
`spec_accept_length` counts it (completion_tokens / spec_verify_ct), 1 / verify_steps higher.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from .model import Eagle3Drafter, embed_tokens


class Proposal(NamedTuple):
    tokens: list[int]  # drafted target ids
    probs: Tensor | None  # [len(tokens), vocab] distribution each was sampled from (T > 0)


class Proposer(Protocol):
    def propose(
        self,
        ids: Tensor,
        aux: Tensor,
        num_steps: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Proposal:
        """Draft after `ids` [L + 1]; `aux` [1, L, num_aux * H] holds the features of ids[:L]."""


def choose(
    logits: Tensor, temperature: float, generator: torch.Generator | None
) -> tuple[int, Tensor | None]:
    """(index, distribution sampled from): argmax at temperature 0, else a softmax sample."""
    if temperature <= 0:
        return int(logits.argmax()), None
    probs = (logits.float() / temperature).softmax(-1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator)), probs


class Eagle3Proposer:
    """Chain drafting with an Eagle3Drafter: the first step over the prefix, then chain steps."""

    def __init__(self, drafter: Eagle3Drafter, embed: nn.Embedding | Tensor):
        self.drafter, self.embed = drafter, embed

    @torch.no_grad()
    def propose(
        self,
        ids: Tensor,
        aux: Tensor,
        num_steps: int,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Proposal:
        d = self.drafter
        dtype, draft_ids = d.fc.weight.dtype, d.draft_ids().cpu()
        step = d.step(embed_tokens(self.embed, ids[None, 1:]).to(dtype), aux.to(dtype))
        last = torch.tensor([ids.numel() - 2], device=ids.device)
        logits, hidden, kv = step.logits[0, -1], step.out[:, -1:], step.kv.select_queries(last)
        tokens, probs = [], []
        for j in range(num_steps):
            index, q = choose(logits, temperature, generator)
            tokens.append(int(draft_ids[index]))
            if q is not None:
                probs.append(torch.zeros(d.cfg.vocab_size).index_copy_(0, draft_ids, q))
            if j + 1 < num_steps:
                token = torch.tensor([[tokens[-1]]], device=ids.device)
                step = d.step(embed_tokens(self.embed, token).to(dtype), hidden, kv)
                logits, hidden, kv = step.logits[0, -1], step.out, step.kv
        return Proposal(tokens, torch.stack(probs) if probs else None)


class CachedTarget:
    """The target with a KV cache of the accepted prefix: `forward(ids)` runs only the ids the
    cache lacks (logits and features of those positions), `keep(length)` drops the entries past
    `length` (the rejected drafts)."""

    def __init__(self, target: nn.Module, aux_indices: Sequence[int] = ()):
        self.target, self.aux_indices, self.cache = target, list(aux_indices), DynamicCache()
        # transformers renamed the forward's cache argument (past_key_values -> cache) in 5.x
        accepted = inspect.signature(target.forward).parameters
        self.cache_arg = "cache" if "cache" in accepted else "past_key_values"

    @property
    def cached(self) -> int:
        return int(self.cache.get_seq_length())

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [n, vocab], aux [1, n, len(aux_indices) * H]) of the n ids past the cache."""
        out = self.target(
            input_ids=ids[None, self.cached :],
            use_cache=True,
            output_hidden_states=bool(self.aux_indices),
            **{self.cache_arg: self.cache},
        )
        if not self.aux_indices:
            return out.logits[0], out.logits.new_empty(1, out.logits.shape[1], 0)
        return out.logits[0], torch.cat([out.hidden_states[i] for i in self.aux_indices], dim=-1)

    def keep(self, length: int) -> None:
        if self.cached > length:  # a negative crop removes that many entries, in every 5.x
            self.cache.crop(length - self.cached)


def verify_proposal(
    logits: Tensor, proposal: Proposal, temperature: float, generator: torch.Generator | None
) -> tuple[int, int]:
    """(drafts accepted, next token) from target logits [num_drafts + 1, vocab].

    Row j scores draft j; the row after the last accepted draft gives the correction or bonus.
    """
    tokens = proposal.tokens
    if temperature <= 0:
        choice = logits.argmax(-1).tolist()
        n = 0
        while n < len(tokens) and tokens[n] == choice[n]:
            n += 1
        return n, choice[n]
    if proposal.probs is None:
        raise ValueError("sampled verification needs the draft distributions (Proposal.probs)")
    p = (logits.float() / temperature).softmax(-1).cpu()
    q = proposal.probs.float().cpu()
    for j, x in enumerate(tokens):
        if float(torch.rand((), generator=generator)) * q[j, x] <= p[j, x]:
            continue
        residual = (p[j] - q[j]).clamp(min=0)
        residual = residual if residual.sum() > 0 else p[j]
        return j, int(torch.multinomial(residual, 1, generator=generator))
    return len(tokens), int(torch.multinomial(p[len(tokens)], 1, generator=generator))


@dataclass
class SpecResult:
    output_ids: list[int]  # generated tokens, stop token included
    accepted: list[int]  # drafts accepted at each verify step
    num_steps: int

    @property
    def verify_steps(self) -> int:
        return len(self.accepted)

    @property
    def accepted_per_position(self) -> list[int]:
        """How many verify steps accepted draft j (and so every draft before it), j = 1..n."""
        return [sum(a >= j for a in self.accepted) for j in range(1, self.num_steps + 1)]


@torch.no_grad()
def speculative_generate(
    target: nn.Module,
    drafter: Eagle3Drafter | Proposer,
    embed: nn.Embedding | Tensor | None,
    prompt_ids: Sequence[int] | Tensor,
    max_new_tokens: int,
    num_steps: int = 3,
    temperature: float = 0.0,
    stop_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    aux_indices: Sequence[int] | None = None,
) -> SpecResult:
    """Generate with chain speculative decoding; at temperature 0 the output is the target's
    greedy output. `drafter` is an Eagle3Drafter (used with `embed`) or any Proposer."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    proposer: Proposer
    if isinstance(drafter, Eagle3Drafter):
        if embed is None:
            raise ValueError("an Eagle3Drafter drafts from `embed`, the target's token embedding")
        proposer = Eagle3Proposer(drafter, embed)
        aux_indices = list(drafter.cfg.aux_layer_ids if aux_indices is None else aux_indices)
    elif aux_indices is None:
        raise ValueError("a Proposer reads the target features at `aux_indices`; pass them")
    else:
        proposer, aux_indices = drafter, list(aux_indices)
    stop = set(stop_ids)
    device = next(target.parameters()).device
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).flatten()
    cached = CachedTarget(target, aux_indices)
    logits, aux = cached.forward(ids)
    first = choose(logits[-1], temperature, generator)[0]
    result = SpecResult([first], [], num_steps)
    if first in stop or max_new_tokens == 1:
        return result
    ids = torch.cat([ids, ids.new_tensor([first])])
    while True:
        proposal = proposer.propose(ids, aux, num_steps, temperature, generator)
        start = cached.cached  # ids[:start] are cached; logits row 0 scores the first draft
        logits, new_aux = cached.forward(torch.cat([ids, ids.new_tensor(proposal.tokens)]))
        n, next_token = verify_proposal(logits, proposal, temperature, generator)
        result.accepted.append(n)
        accepted = ids.numel() + n  # the new last token has no features (nor cache entry) yet
        aux = torch.cat([aux, new_aux[:, : accepted - start]], dim=1)
        cached.keep(accepted)
        new = proposal.tokens[:n] + [next_token]
        ids = torch.cat([ids, ids.new_tensor(new)])
        for token in new:
            result.output_ids.append(token)
            if token in stop or len(result.output_ids) >= max_new_tokens:
                return result


@dataclass
class AcceptanceStats:
    tau: float  # generated tokens per verify step, bonus included
    conditional: list[float]  # P(draft j accepted | drafts before it accepted), j = 1..n
    unconditional: list[float]  # P(drafts 1..j all accepted)
    verify_steps: int
    tokens: int  # tokens produced by verify steps


def acceptance_stats(results: Sequence[SpecResult]) -> AcceptanceStats:
    """Pool results (same num_steps) into tau and per-position acceptance."""
    steps = {r.num_steps for r in results}
    if len(steps) != 1:
        raise ValueError(f"acceptance_stats: results mix num_steps {sorted(steps)}")
    verify = sum(r.verify_steps for r in results)
    tokens = sum(len(r.output_ids) - 1 for r in results)
    reached = [verify] + [sum(c) for c in zip(*(r.accepted_per_position for r in results))]
    return AcceptanceStats(
        tau=_ratio(tokens, verify),
        conditional=[_ratio(reached[j], reached[j - 1]) for j in range(1, len(reached))],
        unconditional=[_ratio(reached[j], verify) for j in range(1, len(reached))],
        verify_steps=verify,
        tokens=tokens,
    )


def _ratio(num: int, den: int) -> float:
    return num / den if den else float("nan")
