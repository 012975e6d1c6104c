"""Training-time test: unroll the draft as serving runs it, and score each step.

Alignment (docs/serving.md, section 3): at prefix position i, step k reads the embedding of token
i + 1 + k and learns the target's distribution at position i + 1 + k, which predicts token
i + 2 + k. Inputs, targets and the loss mask shift together by the step; a (position, step) pair
is scored only if token i + 2 + k exists, lies inside the sample and is supervised. The loss also
needs the target's own choice there to be a token the draft vocabulary holds; acceptance counts
the other pairs as misses, since serving rejects every draft at them.

Replay (what a benchmark measures): serving drafts from the last accepted token, so the prefix
position i of a round is the one whose step 0 drafts token i + 2 (token i + 1 is known). A span's
first token comes from the prefill; the first round of a span [s, e) is at s - 1, a round at i
that accepts a drafts yields a + 1 tokens (the target adds one) and the next one is at i + a + 1,
until token e - 1 is out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .model import Eagle3Drafter, compiled_on_gpu, embed_tokens


def shift_left(x: Tensor, n: int, fill) -> Tensor:
    """x[:, i + n] at position i, `fill` past the end."""
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)[:, : x.shape[1]]


@dataclass
class SoftLabels:
    """What the target says at each position, restricted to the draft vocabulary."""

    probs: Tensor  # [B, T, draft_vocab] softmax of the target logits over the draft ids
    argmax: Tensor  # [B, T] draft index of the target's choice
    in_vocab: Tensor  # [B, T] bool: the target's full-vocabulary choice is a draft id


@torch.no_grad()
def soft_labels(
    last_or_logits: Tensor,
    drafter: Eagle3Drafter,
    target_lm_head: Tensor | None = None,
    chunk: int = 1024,
) -> SoftLabels:
    """Target distributions from its logits [B, T, vocab] or its final hidden state [B, T, H].

    The final (post-norm) hidden state needs `target_lm_head` [vocab, H]; logits are then computed
    as the target computes them (in its dtype). Work goes `chunk` positions of one sample at a
    time, so the full-vocabulary logits and their fp32 copy (read by the softmax over draft ids
    and by the argmax) are at most [chunk, vocab] whatever the batch size: at a 163,840
    vocabulary, batch-wide ones would take gigabytes. Inside a compiled caller all rows go in one
    pass: a loop over chunks would unroll into a copy of its kernels per chunk and guard on the
    chunk count, compiling again for every length that adds a chunk.
    """
    vocab = drafter.cfg.vocab_size
    is_logits = last_or_logits.shape[-1] == vocab and target_lm_head is None
    head: Tensor | None = None
    if not is_logits:
        if target_lm_head is None or target_lm_head.shape[0] != vocab:
            raise ValueError(
                f"soft_labels: got a last dimension of {last_or_logits.shape[-1]}; pass "
                f"target logits over the full vocabulary ({vocab}) or the final hidden "
                f"state together with the target's lm_head weight [{vocab}, H]"
            )
        head = target_lm_head.to(last_or_logits.dtype).T
    draft_ids = drafter.draft_ids()
    if torch.compiler.is_compiling():
        rows = [last_or_logits.flatten(0, 1)]
    else:
        rows = [part for sample in last_or_logits for part in sample.split(chunk)]
    parts = []
    with torch.autocast(last_or_logits.device.type, enabled=False):
        for part in rows:
            logits = (part if head is None else part @ head).float()
            restricted = logits[:, draft_ids]
            parts.append(
                (restricted.softmax(-1), restricted.argmax(-1), drafter.t2d[logits.argmax(-1)])
            )
    batch_positions = last_or_logits.shape[:2]
    probs, argmax, in_vocab = (torch.cat(p).unflatten(0, batch_positions) for p in zip(*parts))
    return SoftLabels(probs, argmax, in_vocab)


def ttt_unroll(
    drafter: Eagle3Drafter,
    embed: nn.Embedding | Tensor,
    aux: Tensor,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    ttt_steps: int,
) -> list[Tensor]:
    """Draft logits [B, T, draft_vocab] for each step; step k at position i reads token i+1+k.

    Activations run in the compute dtype (autocast's bf16 on a GPU, else the weights' dtype), so
    no step holds or re-casts float32 copies of the features, embeddings or hidden states."""
    device = aux.device.type
    dtype = (
        torch.get_autocast_dtype(device)
        if torch.is_autocast_enabled(device)
        else drafter.fc.weight.dtype
    )
    hidden, kv, logits = aux.detach().to(dtype), None, []
    for k in range(ttt_steps):
        with torch.no_grad():
            embeds = embed_tokens(embed, shift_left(input_ids, k + 1, 0)).to(dtype)
        step = drafter.step(embeds, hidden, kv, key_mask=attention_mask)
        hidden, kv = step.out, step.kv
        logits.append(step.logits)
    return logits


def inside_sample(loss_mask: Tensor, attention_mask: Tensor | None) -> Tensor:
    """[B, T] bool of the real (unpadded) tokens."""
    return (
        torch.ones_like(loss_mask, dtype=torch.bool)
        if attention_mask is None
        else attention_mask.bool()
    )


def supervised_tokens(loss_mask: Tensor, attention_mask: Tensor | None) -> Tensor:
    """[B, T] bool of the tokens trained on: the target's own, one run per loss span."""
    return loss_mask.bool() & inside_sample(loss_mask, attention_mask)


def scored_positions(
    loss_mask: Tensor, attention_mask: Tensor | None, ttt_steps: int
) -> list[Tensor]:
    """Per step, [B, T] bool of the positions whose draft is scored: its token is supervised."""
    inside = inside_sample(loss_mask, attention_mask)
    supervised = loss_mask.bool() & inside
    return [inside & shift_left(supervised, k + 2, False) for k in range(ttt_steps)]


def in_draft_vocab(labels: SoftLabels, scored: list[Tensor]) -> list[Tensor]:
    """The scored positions whose target choice the draft vocabulary holds: the loss's positions
    (the others have nothing the draft could learn)."""
    return [s & shift_left(labels.in_vocab, k + 1, False) for k, s in enumerate(scored)]


def valid_positions(
    labels: SoftLabels, loss_mask: Tensor, attention_mask: Tensor | None, ttt_steps: int
) -> list[Tensor]:
    """Per step, [B, T] bool of the positions whose loss counts."""
    return in_draft_vocab(labels, scored_positions(loss_mask, attention_mask, ttt_steps))


@dataclass
class TTTMetrics:
    """Per-step counts; rates are ratios of sums so batches add up exactly (`a + b`)."""

    ce_sum: Tensor  # [K] soft cross-entropy summed over valid positions
    valid: Tensor  # [K] positions in the loss at step k
    correct: Tensor  # [K] of those, draft argmax == target argmax
    chain_valid: Tensor  # [K] positions scored at every step 0..k
    chain_correct: Tensor  # [K] of those, steps 0..k all correct
    chain_prefix: Tensor  # [K] of those, steps 0..k-1 all correct (all of them at k = 0)
    replay_tokens: Tensor  # [K] tokens of serving's rounds replayed over the supervised spans
    replay_rounds: Tensor  # [K] those rounds (verify steps), drafting chains of k + 1

    @classmethod
    def zeros(cls, steps: int, device: torch.device | str = "cpu") -> TTTMetrics:
        fields = len(cls.__dataclass_fields__)
        return cls(*torch.zeros(fields, steps, dtype=torch.float64, device=device))

    def __add__(self, other: TTTMetrics) -> TTTMetrics:
        return TTTMetrics(
            *(getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__)
        )

    @staticmethod
    def _rate(num: Tensor, den: Tensor) -> list[float]:
        return [n / d if d else float("nan") for n, d in zip(num.tolist(), den.tolist())]

    @property
    def loss(self) -> list[float]:
        return self._rate(self.ce_sum, self.valid)

    @property
    def accuracy(self) -> list[float]:
        return self._rate(self.correct, self.valid)

    @property
    def acceptance_unconditional(self) -> list[float]:
        """Share of chains whose first k + 1 drafts all match the target."""
        return self._rate(self.chain_correct, self.chain_valid)

    @property
    def acceptance_conditional(self) -> list[float]:
        """Share matching at step k among chains that matched at every earlier step."""
        return self._rate(self.chain_correct, self.chain_prefix)

    @property
    def replayed_tau(self) -> list[float]:
        """Tokens per round of greedy chain decoding of k + 1 drafts over the supervised spans:
        rounds start right after each miss, as when serving, not at every position."""
        return self._rate(self.replay_tokens, self.replay_rounds)

    def as_dict(self) -> dict[str, list[float]]:
        return {
            "loss": self.loss,
            "accuracy": self.accuracy,
            "acceptance_conditional": self.acceptance_conditional,
            "acceptance_unconditional": self.acceptance_unconditional,
            "valid_positions": [int(v) for v in self.valid],
        }


def round_starts(supervised: Tensor) -> Tensor:
    """[B, T] bool of the positions a round may start at: tokens i + 1 and i + 2 supervised
    (token i + 1 known, token i + 2 still to produce in the same span)."""
    return shift_left(supervised, 1, False) & shift_left(supervised, 2, False)


def replay_counts(correct: list[Tensor], supervised: Tensor) -> tuple[Tensor, Tensor]:
    """(tokens [K], rounds [K]) of serving's greedy rounds over the supervised spans (module
    docstring), chains of k + 1 drafts, from the per-step [B, T] correctness of every position.

    Each position points to its round's successor (or to an end node); every span's round count
    is the length of its first round's path, found by pointer jumping (log T gathers, no loop
    over rounds). A jump past the span's last round ends the path: it never reaches the next span.
    """
    batch, width = supervised.shape
    can_start = round_starts(supervised)
    first_round = can_start & ~torch.cat([can_start.new_zeros(batch, 1), can_start[:, :-1]], 1)
    can_start, first_round = can_start.flatten(), first_round.flatten()
    span = first_round.cumsum(0)
    n = can_start.numel()
    here = torch.arange(n, device=can_start.device)
    accepted = torch.stack(correct).flatten(1).long().cumprod(0).cumsum(0)  # [K, B*T]
    there = here + accepted + 1
    inside = there.clamp(max=n - 1)
    same_span = (there < n) & can_start[inside] & (span[inside] == span) & can_start
    end = torch.full_like(there[:, :1], n)
    jump = torch.cat([torch.where(same_span, there, n), end], dim=1)  # [K, n + 1]
    length = torch.cat([torch.ones_like(there), torch.zeros_like(end)], dim=1)
    # 2 ** levels > rounds of any span; compiled, a bound that holds for every length (a level
    # past the last changes nothing), so that the graph does not specialise on the length
    levels = 31 if torch.compiler.is_compiling() else width.bit_length()
    for _ in range(levels):
        length = length + length.gather(1, jump)
        jump = jump.gather(1, jump)
    rounds = (length[:, :n] * first_round).sum(1)
    return can_start.sum().expand(len(correct)), rounds


def step_metrics(
    ce: list[Tensor],
    correct: list[Tensor],
    valid: list[Tensor],
    scored: list[Tensor],
    supervised: Tensor,
) -> TTTMetrics:
    """Count per-step and chained matches from [B, T] per-step tensors: loss and accuracy over
    the `valid` positions, chains (acceptance) over the `scored` ones, serving's rounds replayed
    over the `supervised` tokens' spans.

    The counts stay on the tensors' device: copying them to the host here would make the host
    wait for the forward before it queues the backward (and would cut a compiled objective's
    graph in two). Reading a rate copies them when the figures are wanted."""
    chain_valid = torch.ones_like(valid[0])
    chain_correct = torch.ones_like(valid[0])
    rows = []
    for ce_k, correct_k, valid_k, scored_k in zip(ce, correct, valid, scored):
        prefix_correct = chain_correct
        chain_valid = chain_valid & scored_k
        chain_correct = chain_correct & correct_k
        counts = [
            (ce_k.detach() * valid_k).sum(),
            valid_k.sum(),
            (correct_k & valid_k).sum(),
            chain_valid.sum(),
            (chain_correct & chain_valid).sum(),
            (prefix_correct & chain_valid).sum(),
        ]
        rows.append(torch.stack([c.double() for c in counts]))
    replay = [c.double() for c in replay_counts(correct, supervised)]
    return TTTMetrics(*torch.stack(rows, dim=1), *replay)


class ShiftedSoftCrossEntropy(torch.autograd.Function):
    """ce[b, i] = -sum_v probs[b, i + shift, v] * log_softmax(logits[b, i])_v, 0 for the last
    `shift` positions: step k's soft cross-entropy against the labels k + 1 positions ahead.

    The plain form (`shift_left` the labels, `log_softmax(logits.float())`) keeps a float32
    [B, T, draft_vocab] copy of the labels and of the log-probabilities for every TTT step until
    the backward pass: 2 GiB per step at 8192 positions and 32,000 draft ids. Here the labels are
    read in place (the samples' rows flattened, row r against row r + shift; rows that would pair
    with the next sample are zeroed), only the logits (in their own dtype) and one log-sum-exp
    per position are kept, and the backward pass recomputes softmax(logits) - probs. On a GPU
    each pass is one compiled kernel (a row reduction, nothing float32 [rows, vocab] in memory);
    on the CPU the float32 rows of one step exist while it runs."""

    @staticmethod
    def forward(ctx, logits: Tensor, probs: Tensor, shift: int) -> Tensor:
        batch, length, vocab = logits.shape
        ce = logits.new_zeros(batch * length, dtype=torch.float32)
        lse = torch.zeros_like(ce)
        keep = (torch.arange(batch * length, device=logits.device) % length) < length - shift
        if shift < length:
            rows_ce, rows_lse = compiled_on_gpu(_ce_rows, logits.is_cuda)(
                logits.reshape(-1, vocab), probs.reshape(-1, vocab), shift
            )
            ce[: len(rows_ce)] = rows_ce
            lse[: len(rows_lse)] = rows_lse
        ce = ce * keep
        ctx.save_for_backward(logits, probs, lse, keep)
        ctx.shift = shift
        return ce.view(batch, length)

    @staticmethod
    def backward(ctx, grad_ce: Tensor):
        logits, probs, lse, keep = ctx.saved_tensors
        batch, length, vocab = logits.shape
        if ctx.shift >= length:
            return torch.zeros_like(logits), None, None
        grad = compiled_on_gpu(_ce_rows_grad, logits.is_cuda)(
            logits.reshape(-1, vocab),
            probs.reshape(-1, vocab),
            lse,
            grad_ce.reshape(-1) * keep,
            ctx.shift,
        )
        return grad.view(batch, length, vocab), None, None


def shifted_soft_cross_entropy(logits: Tensor, probs: Tensor, shift: int) -> Tensor:
    """`ShiftedSoftCrossEntropy`, or inside a compiled caller the same rows written plainly:
    the caller's graph derives their backward and keeps what its partitioner chooses. (Traced
    with dynamic lengths, the Function failed in torch 2.11's dynamo on an H200, an assertion in
    its autograd-Function tracing, when a second batch shape compiled.)"""
    if not torch.compiler.is_compiling():
        return ShiftedSoftCrossEntropy.apply(logits, probs, shift)
    batch, length, vocab = logits.shape
    rows = batch * length
    keep = (torch.arange(rows, device=logits.device) % length) < length - shift
    flat = logits.reshape(rows, vocab), probs.reshape(rows, vocab)
    rows_ce, _ = _ce_rows(*flat, min(shift, rows))
    return (F.pad(rows_ce, (0, rows - rows_ce.shape[0])) * keep).view(batch, length)


def _ce_rows(logits: Tensor, probs: Tensor, shift: int) -> tuple[Tensor, Tensor]:
    """Soft cross-entropy and log-sum-exp of logits row r against probs row r + shift."""
    z = logits[: logits.shape[0] - shift].float()
    p = probs[shift:]
    lse = torch.logsumexp(z, dim=-1)
    return lse * p.sum(-1) - (p * z).sum(-1), lse


def _ce_rows_grad(logits: Tensor, probs: Tensor, lse: Tensor, grad_ce: Tensor, shift: int):
    """d ce / d logits, the last `shift` rows (no labels) zero."""
    rows = logits.shape[0] - shift
    z, p = logits[:rows].float(), probs[shift:]
    grad = (torch.exp(z - lse[:rows, None]) * p.sum(-1, keepdim=True) - p) * grad_ce[:rows, None]
    return torch.cat([grad.to(logits.dtype), logits.new_zeros(shift, logits.shape[1])])


def drafted(logits: Tensor, shift: int) -> Tensor:
    """The draft's choice [B, T] at each position, -1 in the last `shift` rows of the flattened
    batch: the rows the loss reads against their labels `shift` ahead (`_ce_rows`), the others
    having none. Over the same rows, a compiled step takes the argmax in the loss's own pass over
    the logits instead of a pass of its own (docs/performance.md)."""
    flat = logits.flatten(0, 1)
    rows = flat.shape[0] - min(shift, flat.shape[0])
    choice = F.pad(flat[:rows].argmax(-1), (0, flat.shape[0] - rows), value=-1)
    return choice.view(logits.shape[:2])


def ttt_forward(
    drafter: Eagle3Drafter,
    embed: nn.Embedding | Tensor,
    aux: Tensor,
    last_or_logits: Tensor,
    input_ids: Tensor,
    loss_mask: Tensor,
    attention_mask: Tensor | None = None,
    ttt_steps: int = 7,
    decay: float = 0.8,
    target_lm_head: Tensor | None = None,
    denominators: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, TTTMetrics]:
    """Loss = sum_k decay**k * (soft cross-entropy of step k averaged over its valid positions).

    aux [B, T, num_aux * target_hidden]: target features; last_or_logits: the target's logits or
    final hidden state (with `target_lm_head`); input_ids, loss_mask, attention_mask: [B, T].
    `denominators` maps this batch's valid counts per step [K] to the divisors of its sums (at
    least 1 is the caller's care); data parallelism passes (global count / world size), so that
    the ranks' averaged gradient is the gradient of the mean over the whole global batch however
    unevenly supervision falls.
    """
    labels = soft_labels(last_or_logits, drafter, target_lm_head)
    scored = scored_positions(loss_mask, attention_mask, ttt_steps)
    valid = in_draft_vocab(labels, scored)
    counts = torch.stack([v.sum() for v in valid]).float()
    divisors = denominators(counts) if denominators else counts.clamp(min=1)
    total, ces, corrects = aux.new_zeros((), dtype=torch.float32), [], []
    for k, logits in enumerate(
        ttt_unroll(drafter, embed, aux, input_ids, attention_mask, ttt_steps)
    ):
        ce = shifted_soft_cross_entropy(logits, labels.probs, k + 1)
        total = total + decay**k * (ce * valid[k]).sum() / divisors[k]
        ces.append(ce)
        corrects.append(
            (drafted(logits, k + 1) == shift_left(labels.argmax, k + 1, -1))
            & shift_left(labels.in_vocab, k + 1, False)
        )
    return total, step_metrics(
        ces, corrects, valid, scored, supervised_tokens(loss_mask, attention_mask)
    )
