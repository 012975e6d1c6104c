"""The DFlash training objective: many blocks per sequence, each drafted in parallel from the
target's features before its anchor, scored against the target's own tokens.

As the paper (DFlash, arXiv 2602.06036, section "Training") and SpecForge (specforge/core/dflash.py
`OnlineDFlashModel`) define it:

- anchors: random positions a of a sample whose token is supervised (loss_mask[a]) and whose block
  fits inside the sample (a + block_size <= its length); up to `num_anchors` distinct ones per
  sample, drawn uniformly without replacement.
- block: [x_a, mask, ..., mask] at rotary positions a .. a + block_size - 1, as serving fills it
  (the anchor is the token the target just produced; its features are not yet known).
- attention: a block sees the target features of positions j < a (strictly: at serving time the
  anchor's own features do not exist yet) and every position of its own block, in both
  directions; blocks never see each other. All blocks of a batch run in one forward, their
  queries side by side over the shared context keys.
- labels: block position k (1 .. block_size - 1) predicts x_{a + k}, the token the target itself
  generated there (the data is the target's own output), and counts only where loss_mask[a + k].
- loss: the weighted mean of the cross-entropies, with weight
      w_k = exp(-(k - 1) / gamma)  for k >= 1,   w_0 = 0
  (the paper's position decay: early positions decide how many later drafts survive; it uses
  gamma = 7 for blocks of 16, 5 for 10 and 4 for 8), times loss_mask at the label:
      L = sum_{blocks, k} w_k * m_{a+k} * CE_k / sum_{blocks, k} w_k * m_{a+k}.
  gamma None weighs every drafted position alike.

The inputs are the stored features' batch (`stages.artifacts.hidden.collate`: aux, input_ids,
loss_mask, attention_mask) and the target's frozen embedding and LM head weights, as the EAGLE-3
objective takes them; `DFlashObjective` is a `LoopObjective`, so the training loop of
stages/drafter/training.py trains it as it trains EAGLE-3, its checkpoints selected by `tau`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..drafter.objective import LoopObjective
from .block_mask import BlockVisibility
from .model import DFlashDrafter


@dataclass
class Anchors:
    """Block anchors per sample, ascending; `valid` marks real ones (the rest pad the batch to
    one count per row: position 0, no loss, no context)."""

    positions: Tensor  # [B, N] int64
    valid: Tensor  # [B, N] bool


@dataclass
class DFlashMetrics:
    """Sums over a batch's valid blocks, for accuracy per block position and acceptance."""

    correct: Tensor  # [block_size - 1] argmax == label at scored positions, per draft position
    scored: Tensor  # [block_size - 1] positions with a supervised label
    accepted: Tensor  # [] leading correct drafts per block (what one verify round accepts)
    blocks: Tensor  # [] valid blocks

    @classmethod
    def zeros(cls, block_size: int, device: torch.device | str = "cpu") -> DFlashMetrics:
        drafts = torch.zeros(block_size - 1, dtype=torch.int64, device=device)
        none = torch.zeros((), dtype=torch.int64, device=device)
        return cls(drafts, drafts.clone(), none, none.clone())

    def __add__(self, other: DFlashMetrics) -> DFlashMetrics:
        return DFlashMetrics(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )

    @property
    def accuracy(self) -> list[float]:
        """Per draft position 1 .. block_size - 1, the share of scored labels the argmax hits."""
        return [
            c / n if n else float("nan")
            for c, n in zip(self.correct.tolist(), self.scored.tolist())
        ]

    @property
    def tau(self) -> float:
        """Expected tokens per verify step: the mean leading run of correct drafts per block,
        plus the token the target adds (its own at the first miss, or the bonus after the block)."""
        return float(self.accepted) / float(self.blocks) + 1 if self.blocks else float("nan")


def eligible_anchors(loss_mask: Tensor, attention_mask: Tensor | None, block_size: int) -> Tensor:
    """[B, T] bool: supervised positions whose whole block lies inside the sample."""
    T = loss_mask.shape[1]
    lengths = (
        torch.full_like(loss_mask[:, 0], T, dtype=torch.long)
        if attention_mask is None
        else attention_mask.long().sum(1)
    )
    fits = torch.arange(T, device=loss_mask.device)[None] + block_size <= lengths[:, None]
    return loss_mask.bool() & fits


def sample_anchors(
    loss_mask: Tensor,
    attention_mask: Tensor | None,
    block_size: int,
    num_anchors: int,
    generator: torch.Generator | None = None,
) -> Anchors:
    """Up to `num_anchors` distinct eligible anchors per sample, uniformly at random (random keys,
    eligible positions first); at least one slot per row, so that a batch without any eligible
    position still yields a (zero) loss with a graph."""
    eligible = eligible_anchors(loss_mask, attention_mask, block_size)
    B, T = eligible.shape
    device = generator.device if generator is not None else loss_mask.device
    keys = torch.rand(B, T, generator=generator, device=device).to(loss_mask.device)
    keys = keys.masked_fill(~eligible, 2.0)
    counts = eligible.sum(1)
    n = max(1, min(num_anchors, int(counts.max())))
    chosen = keys.argsort(dim=1)[:, :n]
    taken = torch.arange(n, device=loss_mask.device)[None] < counts[:, None]
    positions = torch.where(taken, chosen, T).sort(dim=1).values
    valid = positions < T
    return Anchors(torch.where(valid, positions, 0), valid)


def position_weights(block_size: int, decay_gamma: float | None, device=None) -> Tensor:
    """[block_size] w_k: 0 for the anchor, exp(-(k - 1) / gamma) for the drafted positions."""
    k = torch.arange(block_size, device=device, dtype=torch.float32)
    decay = torch.ones_like(k) if decay_gamma is None else torch.exp(-(k - 1) / decay_gamma)
    return torch.where(k > 0, decay, torch.zeros_like(k))


def block_tokens(input_ids: Tensor, anchors: Anchors, block_size: int, mask_token_id: int):
    """(ids, positions) of the blocks, each [B, N * block_size]: the anchor's token then masks,
    at positions anchor + k."""
    B, N = anchors.positions.shape
    offsets = torch.arange(block_size, device=input_ids.device)
    positions = anchors.positions[..., None] + offsets  # [B, N, bs]
    ids = torch.full_like(positions, mask_token_id)
    ids[..., 0] = torch.gather(input_ids, 1, anchors.positions)
    return ids.view(B, -1), positions.view(B, -1)


def block_visibility(anchors: Anchors, block_size: int) -> BlockVisibility:
    """Block n sees the context positions before its anchor (none for a padding block) and its
    own block, both ways; never another block."""
    N = anchors.positions.shape[1]
    block_of_query = torch.arange(N * block_size, device=anchors.positions.device) // block_size
    limit = torch.where(anchors.valid, anchors.positions, 0)[:, block_of_query]  # [B, Q]
    return BlockVisibility(limit, block_size)


def block_labels(
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Anchors,
    block_size: int,
    decay_gamma: float | None,
) -> tuple[Tensor, Tensor]:
    """(labels, weights), each [B, N, block_size - 1]: the token at anchor + k and its loss weight
    w_k * loss_mask[anchor + k] (zero for padding blocks), for k = 1 .. block_size - 1."""
    T = input_ids.shape[1]
    k = torch.arange(1, block_size, device=input_ids.device)
    at = (anchors.positions[..., None] + k).clamp(max=T - 1).flatten(1)  # [B, N * (bs - 1)]
    shape = (*anchors.positions.shape, block_size - 1)
    labels = torch.gather(input_ids, 1, at).view(shape)
    supervised = torch.gather(loss_mask.float(), 1, at).view(shape)
    w = position_weights(block_size, decay_gamma, input_ids.device)[1:]
    return labels, w * supervised * anchors.valid[..., None].float()


def dflash_loss(
    drafter: DFlashDrafter,
    embed: Tensor,
    lm_head: Tensor,
    aux: Tensor,
    input_ids: Tensor,
    loss_mask: Tensor,
    anchors: Anchors,
    decay_gamma: float | None,
) -> tuple[Tensor, DFlashMetrics]:
    """The weighted block cross-entropy of one batch (module docstring) and its metrics.

    embed, lm_head [vocab, hidden]: the target's frozen weights; aux [B, T, features];
    input_ids, loss_mask [B, T]; anchors from `sample_anchors`."""
    cfg = drafter.cfg
    bs = cfg.block_size
    B, N = anchors.positions.shape
    ids, positions = block_tokens(input_ids, anchors, bs, cfg.mask_token_id)
    visible = block_visibility(anchors, bs)
    embeds = F.embedding(ids, embed).to(aux.dtype)
    hidden = drafter(embeds, positions, aux, visible).view(B, N, bs, -1)[:, :, 1:]
    # the drafted positions as rows of one product: `@` on the 4-d slice (no 2-d view of it
    # exists) broadcasts the head into a batched product that reads all of it once per block
    rows = hidden.reshape(-1, hidden.shape[-1])
    logits = (rows @ lm_head.to(hidden.dtype).T).float().view(B, N, bs - 1, -1)
    labels, weights = block_labels(input_ids, loss_mask, anchors, bs, decay_gamma)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(weights)
    loss = (ce * weights).sum() / weights.sum().clamp(min=torch.finfo(torch.float32).tiny)
    return loss, block_metrics(logits, labels, weights > 0, anchors.valid)


@torch.no_grad()
def block_metrics(logits: Tensor, labels: Tensor, scored: Tensor, valid: Tensor) -> DFlashMetrics:
    """Per draft position: hits and scored labels; per block: the leading run of hits."""
    hits = (logits.argmax(-1) == labels) & scored
    return DFlashMetrics(
        correct=hits.sum((0, 1)),
        scored=scored.sum((0, 1)),
        accepted=(hits.long().cumprod(-1).sum(-1) * valid).sum(),
        blocks=valid.sum(),
    )


class DFlashObjective(LoopObjective):
    """Drafter + the frozen target tensors; forward(batch) -> (loss, metrics), the batch as
    `stages.artifacts.hidden.collate` builds it. Training anchors are drawn from its own
    generator (its state goes into every checkpoint, so a resumed run draws what the run would
    have drawn); an evaluation's from a second one reseeded each time it starts, so every
    evaluation scores the same blocks and never moves the training draws."""

    ACCEPTANCE = "tau"
    drafter: DFlashDrafter

    def __init__(
        self,
        drafter: DFlashDrafter,
        embed: Tensor,
        lm_head: Tensor,
        num_anchors: int,
        decay_gamma: float | None,
        seed: int = 0,
    ):
        super().__init__()
        if num_anchors < 1 or (decay_gamma is not None and not decay_gamma > 0):
            raise ValueError(
                f"DFlashObjective: num_anchors {num_anchors} must be at least 1 and decay_gamma "
                f"{decay_gamma} positive (or None for no decay)"
            )
        target = (drafter.cfg.vocab_size, drafter.cfg.hidden_size)
        for name, weight in (("embed", embed), ("lm_head", lm_head)):
            if tuple(weight.shape) != target:
                raise ValueError(
                    f"DFlashObjective: {name} {tuple(weight.shape)} is not the target's "
                    f"{list(target)} weight"
                )
        self.drafter = drafter
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        self.num_anchors, self.decay_gamma, self.seed = num_anchors, decay_gamma, seed
        self.generator = torch.Generator().manual_seed(seed)
        self.eval_generator = torch.Generator().manual_seed(seed)
        # drawn eagerly: compiled, the objective is one graph from the anchors on (a generator
        # and a data-dependent count do not trace); wrapped here, not at import, which would
        # import the compiler into every stage's start-up (docs/performance.md, 2026-12-05)
        self.anchors = torch.compiler.disable(self.draw_anchors)

    def draw_anchors(self, batch: dict[str, Tensor]) -> Anchors:
        """The batch's blocks, from the training or the evaluation generator."""
        return sample_anchors(
            batch["loss_mask"],
            batch.get("attention_mask"),
            self.drafter.cfg.block_size,
            self.num_anchors,
            self.generator if self.training else self.eval_generator,
        )

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, DFlashMetrics]:
        anchors = self.anchors(batch)
        return dflash_loss(
            self.drafter,
            self.embed,
            self.lm_head,
            batch["aux"],
            batch["input_ids"],
            batch["loss_mask"],
            anchors,
            self.decay_gamma,
        )

    def train(self, mode: bool = True) -> DFlashObjective:
        if not mode:  # an evaluation starts: the same blocks as every other
            self.eval_generator.manual_seed(self.seed)
        return super().train(mode)

    def zero_metrics(self, device: torch.device) -> DFlashMetrics:
        return DFlashMetrics.zeros(self.drafter.cfg.block_size, device)

    def acceptance(self, metrics: DFlashMetrics) -> float:
        return metrics.tau

    def evaluation(self, metrics: DFlashMetrics) -> dict[str, Any]:
        """tau (checkpoints are selected by it), the accuracy per draft position, the blocks."""
        return {
            "tau": round(metrics.tau, 4),
            "accuracy": [round(a, 4) for a in metrics.accuracy],
            "blocks": int(metrics.blocks),
        }

    def describe(self, evaluation: dict[str, Any]) -> str:
        return (
            f"tau {evaluation['tau']:.3f} (accepted per verify step, blocks of "
            f"{self.drafter.cfg.block_size}, {evaluation['blocks']} blocks)"
        )

    def loop_state(self) -> dict[str, Tensor]:
        return {"anchors": self.generator.get_state()}

    def load_loop_state(self, state: dict[str, Tensor]) -> None:
        self.generator.set_state(state["anchors"])
