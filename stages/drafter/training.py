"""The training loop of every drafter: AdamW, warmup + cosine, grad clip, exact resume, and
checkpoint selection by acceptance length (not by loss), the quantity a benchmark measures.

What it trains is a `LoopObjective` (objective.py): EAGLE-3's `Objective` below (training-time
test; its acceptance serving's rounds replayed over the eval spans) or DFlash's
(stages/dflash/objective.py). Plain torch; DistributedDataParallel when launched by torchrun. The
step itself is the objective's forward, so it can be compiled or benchmarked alone. Batches come
from the stored features, or (online, `extract.store: none`) from `TargetFeatures` run on each
batch on the device.
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

import torch
from torch import nn

from ..artifacts.hidden import HiddenStates, collate
from ..runtime.files import atomic_path, verify_checksum
from ..runtime.parallel import Rank
from .fp8 import fp8_problem
from .knobs import LoopKnobs, TTTKnobs
from .model import Eagle3Drafter, use_fp8
from .objective import LoopObjective, Metrics, feature_dtype
from .ttt import TTTMetrics, ttt_forward


class TargetFeatures(Protocol):
    """Online features (stages.capture.online): a batch of input_ids / loss_mask / attention_mask
    on the device -> the same batch with the target's aux and last, as training would have read
    them from shards. `seconds`: the time spent in the target so far. `join`: the call of a
    rank that has no batch of its own this round (a tensor-parallel target runs every rank's
    batches in one forward that all ranks take part in)."""

    seconds: float

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def join(self) -> None: ...


class LoopState(TypedDict):
    """Where training stands; saved with each checkpoint, so a resumed run continues there."""

    step: int
    epoch: int
    cursor: int  # position in this epoch's shuffled sample order
    best_tau: float  # the best evaluation's acceptance (the objective's ACCEPTANCE figure)


class Objective(LoopObjective):
    """EAGLE-3: drafter + the frozen target tensors it needs; forward(batch) -> (loss, metrics).
    Its evaluations replay chains of `eval_num_steps` drafts (None: ttt_steps)."""

    ACCEPTANCE = "replayed_tau"
    drafter: Eagle3Drafter

    def __init__(
        self,
        drafter: Eagle3Drafter,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        ttt_steps: int,
        decay: float,
        eval_num_steps: int | None = None,
    ):
        super().__init__()
        self.drafter = drafter
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("lm_head", lm_head, persistent=False)
        self.ttt_steps, self.decay = ttt_steps, decay
        self.eval_num_steps = eval_num_steps or ttt_steps

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, TTTMetrics]:
        # Training under DDP: every rank divides by the global count (eval batches differ in
        # number per rank, so evaluation keeps local means and issues no collective).
        global_mean = self.training and self.world > 1
        return ttt_forward(
            self.drafter,
            self.embed,
            batch["aux"],
            batch["last"],
            batch["input_ids"],
            batch["loss_mask"],
            batch["attention_mask"],
            self.ttt_steps,
            self.decay,
            target_lm_head=self.lm_head,
            denominators=self.per_rank_share if global_mean else None,
        )

    def zero_metrics(self, device: torch.device) -> TTTMetrics:
        return TTTMetrics.zeros(self.ttt_steps, device)

    def acceptance(self, metrics: TTTMetrics) -> float:
        return replayed_tau(metrics, self.eval_num_steps)

    def evaluation(self, metrics: TTTMetrics) -> dict[str, Any]:
        """Replayed tau (checkpoints are selected by it), simulated tau, and the per-step rates."""
        return {
            "replayed_tau": round(self.acceptance(metrics), 4),
            "simulated_tau": round(simulated_tau(metrics, self.eval_num_steps), 4),
            **{k: [round(x, 4) for x in v] for k, v in metrics.as_dict().items()},
        }

    def describe(self, evaluation: dict[str, Any]) -> str:
        return (
            f"replayed tau {evaluation['replayed_tau']:.3f}, simulated "
            f"{evaluation['simulated_tau']:.3f} (chain of {self.eval_num_steps})"
        )

    def per_rank_share(self, counts: torch.Tensor) -> torch.Tensor:
        """Valid positions of the whole global batch (at least 1), per step, over the world size:
        a rank's share may be below 1 when the global batch has a single valid position."""
        counts = counts.clone()
        torch.distributed.all_reduce(counts)
        return counts.clamp(min=1) / self.world


@dataclass(frozen=True)
class TrainingSettings(LoopKnobs):
    """The loop's knobs as the user set them, and what a stage derives from its own keys."""

    _: KW_ONLY
    total_steps: int  # from the section's epochs or max_steps, and the training split's size
    warmup_steps: int  # from its warmup_ratio
    compile: bool = False  # on a GPU, the training steps run `compiled_objective`
    section: str = "train"  # the params section of these knobs, which messages name


@dataclass(frozen=True)
class LoopSettings(TrainingSettings, TTTKnobs):
    """EAGLE-3's run: the loop's settings and its objective's knobs, as the train stage reads
    them (its `Objective` is built from these)."""


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup to 1, then cosine down to min_ratio at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def simulated_tau(metrics: TTTMetrics, num_steps: int) -> float:
    """Expected chain acceptance length: 1 (bonus) + sum of unconditional per-step acceptance."""
    return 1.0 + sum(metrics.acceptance_unconditional[:num_steps])


def replayed_tau(metrics: TTTMetrics, num_steps: int) -> float:
    """Tokens per round of greedy chain decoding replayed over the eval spans. Lower than
    simulated_tau: misses cluster, and serving starts its next round right after each one."""
    return metrics.replayed_tau[:num_steps][-1]


# A run's first steps compile kernels (flex attention, the loss chunks): timed apart from the rate.
WARMUP_STEPS = 3


@dataclass
class History:
    steps: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    tokens: int = 0  # trained on by this run (all ranks) after its warm-up, for its throughput
    seconds: float = 0.0  # spent in those steps (evaluation and saving excluded)
    warmup_seconds: float = 0.0  # spent in this run's first WARMUP_STEPS steps
    padding: int = 0  # positions of the run's batches (all ranks, every step so far): padding
    positions: int = 0  # all positions of those batches
    compile_failed_at: int | None = None  # this run's step whose compilation failed (then eager)
    target_seconds: float = 0.0  # of `seconds`, spent in the target's forward (online features)

    def add_step(
        self, tokens: int, positions: int, seconds: float, warming_up: bool, target_s: float = 0.0
    ) -> None:
        self.padding, self.positions = self.padding + positions - tokens, self.positions + positions
        if warming_up:
            self.warmup_seconds += seconds
        else:
            self.tokens, self.seconds = self.tokens + tokens, self.seconds + seconds
            self.target_seconds += target_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def target_share(self) -> float:
        """Of the steps' time after the warm-up, the share spent in the target (0 offline)."""
        return self.target_seconds / self.seconds if self.seconds else 0.0

    @property
    def padding_share(self) -> float:
        """Of the positions the steps computed, the share that was padding (no token)."""
        return self.padding / self.positions if self.positions else 0.0

    def best(self, acceptance: str) -> dict | None:
        """The evaluation of the largest `acceptance` (the exported checkpoint's), if any ran."""
        return max(self.evals, key=lambda e: e[acceptance], default=None)

    def speed(self) -> dict[str, Any]:
        """How fast the run's steps went, as the stage reports keep it."""
        return {
            "tokens_per_s": round(self.tokens_per_s, 1),
            "warmup_s": round(self.warmup_seconds, 1),
            "padding_share": round(self.padding_share, 4),
            "compile_failed_at_step": self.compile_failed_at,
        }


def batch_order(
    lengths: list[int], seed: int, epoch: int, batch_size: int, window: int
) -> list[int]:
    """The epoch's samples in a seeded order whose consecutive `batch_size` slices are its
    global batches. With `window` > 1, each run of `window` batches is cut from its samples
    sorted by length and then shuffled: batches of like lengths pad little (collate pads to the
    longest), and which lengths come when stays random."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    if window <= 1 or batch_size <= 1:  # one sample per batch pads nothing
        return order
    grouped, span = [], window * batch_size
    for start in range(0, len(order), span):
        run = sorted(order[start : start + span], key=lengths.__getitem__)
        batches = [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
        full = len(run) // batch_size  # a short batch (the epoch's last) stays at the end
        for k in torch.randperm(full, generator=g).tolist() + list(range(full, len(batches))):
            grouped += batches[k]
    return grouped


def evaluate(
    objective: LoopObjective,
    data: HiddenStates,
    s: TrainingSettings,
    device: torch.device,
    autocast,
    rank: Rank = Rank(),
    features: TargetFeatures | None = None,
) -> Any:
    """Metrics over the first eval_max_samples samples; each rank scores every world-th batch
    (a rank past the last batch joins a collective target's forward instead)."""
    n = min(len(data), s.eval_max_samples)
    if not n:
        return None
    total = objective.zero_metrics(device)
    objective.eval()
    with torch.no_grad():
        for first in range(0, n, s.batch_size * rank.world):
            start = first + rank.rank * s.batch_size
            if start >= n:
                if features is not None:
                    features.join()
                continue
            batch = on_device(
                collate(
                    [data[i] for i in range(start, min(start + s.batch_size, n))],
                    feature_dtype(device),
                ),
                device,
                features,
            )
            with autocast():
                _, metrics = objective(batch)
            total = total + metrics
    objective.train()
    return summed(total, rank, device)


def summed(metrics: Any, rank: Rank, device: torch.device) -> Any:
    """Counts (each field of the metrics dataclass) added up over the ranks in one collective:
    rates of the whole global batch, exact (they are sums)."""
    if rank.world == 1:
        return metrics
    parts = {f.name: getattr(metrics, f.name) for f in dataclasses.fields(metrics)}
    counts = torch.cat([t.reshape(-1).to(device, torch.float64) for t in parts.values()])
    torch.distributed.all_reduce(counts)
    sizes = [t.numel() for t in parts.values()]
    added = {
        name: total.view(t.shape).to(t.dtype)
        for (name, t), total in zip(parts.items(), counts.cpu().split(sizes))
    }
    return dataclasses.replace(metrics, **added)


def step_totals(
    loss: torch.Tensor, attention_mask: torch.Tensor, rank: Rank
) -> tuple[float, int, int]:
    """(the step's loss averaged over the ranks, the tokens of the whole global batch, its
    positions with padding).

    Each rank's loss is its share of the global mean (`Objective.per_rank_share`), so the
    average over ranks is the loss of the global batch, the objective DDP's gradient descends.
    """
    positions = torch.tensor(attention_mask.numel(), device=loss.device)
    sums = torch.stack([loss.detach().float(), attention_mask.sum().float(), positions.float()])
    if rank.world > 1:
        torch.distributed.all_reduce(sums)
    loss_sum, token_sum, position_sum = sums.tolist()
    return loss_sum / rank.world, int(token_sum), int(position_sum)


def autocast_for(device: torch.device):
    """bf16 autocast on GPU, plain fp32 on CPU: a factory of context managers."""
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return lambda: torch.autocast("cpu", enabled=False)


def adamw(params: list, lr: float, weight_decay: float, device: torch.device):
    """AdamW as training runs it (betas 0.9 / 0.95); on a GPU one fused kernel updates every
    parameter instead of a dozen elementwise passes over each."""
    return torch.optim.AdamW(
        params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.95), fused=device.type == "cuda"
    )


def root_cause(err: BaseException) -> str:
    """The innermost error under a compilation failure (dynamo wraps its backend's as
    `inner_exception`, without a __cause__), as "Type: first line of its message"."""
    while (inner := getattr(err, "inner_exception", None) or err.__cause__) is not None:
        err = inner
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def compiles(compile: bool, device: torch.device) -> bool:
    """Whether the training steps run compiled: `train.compile` on a GPU (the CPU runs eager)."""
    return compile and device.type == "cuda"


def compiled_objective(model: nn.Module) -> Callable[[dict], tuple[torch.Tensor, Metrics]]:
    """The objective (or its DDP wrapper) compiled as one graph: the drafter's forward (EAGLE-3's
    TTT unroll, DFlash's blocks), the loss and the metrics, forward and backward. Eager, a step
    launches many small kernels and the GPU idles while the host queues the small ones;
    compiled, the elementwise work fuses and the GEMMs run back to back (docs/performance.md).

    The first call compiles for its batch shape; a second shape compiles once more with dynamic
    lengths, which every later batch then shares (torch.compile's automatic dynamic shapes)."""
    return torch.compile(model)


def training_step(
    model: Callable[[dict], tuple[torch.Tensor, Metrics]],
    batch: dict,
    params: list,
    opt: torch.optim.Optimizer,
    grad_clip: float,
    autocast,
) -> tuple[torch.Tensor, Metrics, torch.Tensor]:
    """One optimizer step (forward, backward, clip, AdamW): the unit the benchmarks time."""
    with autocast():
        loss, metrics = model(batch)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss, metrics, grad_norm


@dataclass
class Optimization:
    """The objective (its drafter) and what updates it, kept together: checkpoints save and
    restore them as one, and a compilation that fails mid-run swaps `step_model` for the eager
    `model` for good."""

    objective: LoopObjective
    model: nn.Module  # the objective, or its DDP wrapper: what runs eager
    step_model: Callable[[dict], tuple[torch.Tensor, Metrics]]  # `model`, or it compiled
    params: list
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LambdaLR
    autocast: Callable
    grad_clip: float

    @property
    def drafter(self) -> nn.Module:
        return self.objective.drafter

    def step(self, batch: dict) -> tuple[torch.Tensor, Metrics, torch.Tensor]:
        """`training_step` with this run's parts: the eager retry repeats the same step."""
        return training_step(
            self.step_model, batch, self.params, self.opt, self.grad_clip, self.autocast
        )


def train(
    objective: LoopObjective,
    train_set: HiddenStates,
    eval_set: HiddenStates,
    s: TrainingSettings,
    checkpoint_dir: Path,
    device: torch.device,
    rank: Rank = Rank(),
    log: Callable[[str], None] = print,
    features: TargetFeatures | None = None,
    observe: Callable[[int, dict[str, float]], None] | None = None,
    stage: str = "train",
) -> History:
    """Train to s.total_steps (resuming from checkpoint_dir/last.pt), logging as `stage`;
    `features` computes each batch's features on the device when the shards hold none (its time
    counts in tokens/s); `observe` (rank 0's) gets each logged step's figures and evaluation."""
    log = stage_log(log, stage, rank)
    model = data_parallel(objective, device, rank)
    compiling = compiles(s.compile, device)
    optim = optimization(model, objective, s, device, compiling)
    last = checkpoint_dir / "last.pt"
    state, history = resume(last, optim, log)
    first = state["step"]
    stream = prefetched(remaining_batches(train_set, s, state, rank, device))
    if compiling:  # silent for a long while otherwise (compile times: docs/performance.md)
        log("the first step compiles the objective (minutes on a GPU)")
    clock = time.monotonic()
    for state["epoch"], state["cursor"], batch in stream:
        in_target = target_seconds(features)
        batch = on_device(batch, device, features)
        step = state["step"] + 1
        loss, metrics, grad_norm = optimizer_step(optim, batch, s.fp8, step, history, log)
        metrics = summed(metrics, rank, device)
        step_loss, step_tokens, positions = step_totals(loss, batch["attention_mask"], rank)
        refuse_diverged(step_loss, step, s)
        state["step"] = step
        # a run too short to have steps after its warm-up counts them all
        warming_up = state["step"] - first <= WARMUP_STEPS < s.total_steps - first
        seconds = time.monotonic() - clock
        in_target = target_seconds(features) - in_target
        history.add_step(step_tokens, positions, seconds, warming_up, in_target)
        if state["step"] == first + 1:
            log(f"first step {seconds:.3f} s (warm-up, not in the rate)")
        row = step_row(state["step"], step_loss, optim.sched.get_last_lr()[0], grad_norm, metrics)
        history.steps.append(row)
        if logged := due(state["step"], 10, s.total_steps):
            log(progress(row, history, s.total_steps, first))
        evaluated = False
        if due(state["step"], s.eval_every, s.total_steps):
            ev = evaluate(objective, eval_set, s, device, optim.autocast, rank, features)
            if evaluated := ev is not None:
                tau = record_eval(objective, ev, state["step"], history, log)
                keep_if_best(tau, state, optim.drafter, checkpoint_dir / "best.pt", rank)
        if observe is not None and (logged or evaluated):
            last_eval = history.evals[-1] if evaluated else None
            observe(state["step"], live_figures(row, objective.ACCEPTANCE, last_eval))
        if rank.main and due(state["step"], s.checkpoint_every, s.total_steps):
            _save(last, checkpoint(optim, state, history))
        clock = time.monotonic()  # evaluation and saving are not training time
    return history


def refuse_diverged(loss: float, step: int, s: TrainingSettings) -> None:
    """A loss that is not finite has made the drafter's weights NaN through its step's update:
    the run stops there, its earlier checkpoints kept, rather than training NaN to the last step
    and exporting a drafter that drafts nothing."""
    if not math.isfinite(loss):
        key = f"{s.section}."
        fp8 = f" or set {key}fp8 false" if s.fp8 else ""
        raise ValueError(
            f"the loss is {loss} at step {step}: training diverged. Lower {key}lr ({s.lr:g}) or "
            f"lengthen {key}warmup_ratio{fp8}, then rerun (checkpoints before step {step} are "
            "kept)"
        )


def live_figures(row: dict, acceptance: str, evaluation: dict | None) -> dict[str, float]:
    """A logged step's loss, and the acceptance figure of the evaluation just run (EAGLE-3's
    replayed tau): what a running experiment is followed by (the rest is in the stage report's
    plots)."""
    figures = {"train/loss": float(row["loss"])}
    if evaluation is not None:
        figures[f"eval/{acceptance}"] = evaluation[acceptance]
    return figures


def data_parallel(objective: LoopObjective, device: torch.device, rank: Rank) -> nn.Module:
    """`objective` placed on `device` and, under torchrun, wrapped in DDP without its buffers:
    they (the target's embedding and head) are the same file on every rank, and broadcasting them
    before every forward would move gigabytes for nothing."""
    objective.place(device)
    objective.world = rank.world
    model: nn.Module = objective
    if rank.world > 1:
        model = nn.parallel.DistributedDataParallel(
            objective,
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False,
        )
    return model


def refuse_unfit_fp8(s: TrainingSettings, drafter: nn.Module, device: torch.device) -> None:
    """FP8 where it cannot run, or would run slower than bf16, fails before the first step rather
    than hours into the run."""
    if s.fp8 and (problem := fp8_problem(device, use_fp8(drafter, False))):
        raise ValueError(f"fp8: {problem}; set it to false")
    if s.fp8 and not s.compile:  # eager, each quantisation is kernels of its own
        raise ValueError(
            "fp8: runs compiled only (set compile: true): eager, its quantisation runs as separate "
            "kernels and the step is slower than bf16's (docs/performance.md)"
        )


def optimization(
    model: nn.Module,
    objective: LoopObjective,
    s: TrainingSettings,
    device: torch.device,
    compiling: bool,
) -> Optimization:
    """A fresh optimizer and schedule for the drafter's trainable parameters (refused first where
    `fp8` cannot run): a resumed run then loads their state from its checkpoint."""
    refuse_unfit_fp8(s, objective.drafter, device)
    step_model = compiled_objective(model) if compiling else model
    params = [p for p in objective.drafter.parameters() if p.requires_grad]
    opt = adamw(params, s.lr, s.weight_decay, device)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, s.warmup_steps, s.total_steps, s.min_lr_ratio)
    )
    return Optimization(
        objective, model, step_model, params, opt, sched, autocast_for(device), s.grad_clip
    )


def resume(
    last: Path, optim: Optimization, log: Callable[[str], None]
) -> tuple[LoopState, History]:
    """Where the run stands: at its start, or where checkpoint `last` left it, with the drafter,
    optimizer, schedule, RNG and the objective's own state (DFlash's anchor generator) as they
    were, so that the resumed run continues exactly."""
    state: LoopState = {"step": 0, "epoch": 0, "cursor": 0, "best_tau": -1.0}
    if not last.exists():
        return state, History()
    verify_checksum(last)  # a checkpoint a machine crash cut short is named, not loaded
    ckpt = torch.load(last, map_location="cpu", weights_only=True)
    optim.drafter.load_state_dict(ckpt["model"])
    optim.opt.load_state_dict(ckpt["optimizer"])
    optim.sched.load_state_dict(ckpt["scheduler"])
    state.update(ckpt["state"])
    if "best_replayed_tau" in state:  # checkpoint format 3 (checkpoints.py READABLE_FORMATS)
        state["best_tau"] = state.pop("best_replayed_tau")  # type: ignore[typeddict-item]
    torch.set_rng_state(ckpt["rng"])
    optim.objective.load_loop_state(ckpt.get("objective", {}))
    # counts a resumed run carries on (a checkpoint from before they were kept has none)
    counts = {k: ckpt["history"].get(k, 0) for k in ("padding", "positions")}
    history = History(ckpt["history"]["steps"], ckpt["history"]["evals"], **counts)
    log(f"resumed at step {state['step']} (epoch {state['epoch']}, sample {state['cursor']})")
    return state, history


def checkpoint(optim: Optimization, state: LoopState, history: History) -> dict:
    """What `resume` reads back: all a run needs to continue as if it had never stopped."""
    return {
        "model": optim.drafter.state_dict(),
        "optimizer": optim.opt.state_dict(),
        "scheduler": optim.sched.state_dict(),
        "state": dict(state),
        "rng": torch.get_rng_state(),
        "objective": optim.objective.loop_state(),
        "history": {
            "steps": history.steps,
            "evals": history.evals,
            "padding": history.padding,
            "positions": history.positions,
        },
    }


def remaining_batches(
    data: HiddenStates, s: TrainingSettings, state: LoopState, rank: Rank, device: torch.device
) -> Iterator[tuple[int, int, dict]]:
    """The batches left to s.total_steps from where `state` stands, so that a resumed run reads
    the ones it would have read; pinned on a GPU, for their copies to overlap the steps."""
    steps = s.total_steps - state["step"]
    dtype, pin = feature_dtype(device), device.type == "cuda"
    return batch_stream(data, s, state["epoch"], state["cursor"], rank, steps, dtype, pin)


def optimizer_step(
    optim: Optimization,
    batch: dict,
    fp8: bool,
    step: int,
    history: History,
    log: Callable[[str], None],
) -> tuple[torch.Tensor, Metrics, torch.Tensor]:
    """Step `step`, FP8 in training steps only (evaluation drafts as serving does). A recompile
    for a new batch shape can fail hours into a run: it goes on eager (slower, the same
    arithmetic) rather than dying at that batch on every resume."""
    use_fp8(optim.drafter, fp8)
    try:
        loss, metrics, grad_norm = optim.step(batch)
    except torch._dynamo.exc.TorchDynamoException as err:
        if optim.step_model is optim.model:
            raise
        log(
            f"step {step}: compiling the objective failed "
            f"({root_cause(err)}); the run goes on eager"
        )
        history.compile_failed_at, optim.step_model = step, optim.model
        optim.opt.zero_grad(set_to_none=True)  # a backward that failed may have left some
        loss, metrics, grad_norm = optim.step(batch)
    use_fp8(optim.drafter, False)
    optim.sched.step()
    return loss, metrics, grad_norm


def stage_log(log: Callable[[str], None], stage: str, rank: Rank) -> Callable[[str], None]:
    """`log` with each line opened by the stage's name, silent on all ranks but the first (the
    other ranks' figures are the same)."""
    if not rank.main:
        return lambda _: None
    return lambda line: log(f"[{stage}] {line}")


def due(step: int, every: int, total: int) -> bool:
    """Every `every` steps, and at the last step: a run always ends logged, evaluated, saved."""
    return step % every == 0 or step == total


def step_row(
    step: int, loss: float, lr: float | torch.Tensor, grad_norm: torch.Tensor, metrics: Metrics
) -> dict:
    """A step's figures as reports/plots/train_loss.csv keeps them: rounded, for a readable plot."""
    return {
        "step": step,
        "loss": round(loss, 5),
        "lr": lr,
        "grad_norm": round(float(grad_norm), 4),
        **{f"acc_{k}": round(a, 4) for k, a in enumerate(metrics.accuracy)},
    }


def progress(row: dict, history: History, total_steps: int, first: int) -> str:
    """The progress line; its ETA from this run's own steps (a resumed run's earlier ones took
    their time in another process)."""
    spent = history.seconds + history.warmup_seconds
    eta = (total_steps - row["step"]) * spent / (row["step"] - first)
    return (
        f"step {row['step']}/{total_steps} loss {row['loss']:.4f} "
        f"acc0 {row['acc_0']:.3f} lr {row['lr']:.2e} {history.tokens_per_s:,.0f} tok/s "
        f"eta {eta:,.0f}s"
    )


def record_eval(
    objective: LoopObjective, ev: Any, step: int, history: History, log: Callable[[str], None]
) -> float:
    """Keep an evaluation in the history (the report and `dvc plots` read it); its acceptance
    (unrounded), the figure checkpoints are selected by."""
    evaluation = objective.evaluation(ev)
    history.evals.append({"step": step, **evaluation})
    log(f"eval step {step}: {objective.describe(evaluation)}")
    return objective.acceptance(ev)


def keep_if_best(tau: float, state: LoopState, drafter: nn.Module, path: Path, rank: Rank) -> None:
    """Save the drafter at `path` when its acceptance length beats the best so far: selection
    by what a benchmark measures, not by loss. Every rank tracks the best (it is in the
    checkpoint's state); rank 0 writes it."""
    if tau > state["best_tau"]:
        state["best_tau"] = tau
        if rank.main:
            _save(path, {"model": drafter.state_dict(), "step": state["step"], "tau": tau})


def batch_stream(
    data: HiddenStates,
    s: TrainingSettings,
    epoch: int,
    cursor: int,
    rank: Rank,
    steps: int,
    dtype: torch.dtype | None,
    pin: bool,
) -> Iterator[tuple[int, int, dict]]:
    """(epoch, cursor after it, this rank's collated share) of each of the next `steps` global
    batches: a seeded shuffle per epoch, so a resumed run sees the batches it would have seen."""

    def order_of(epoch: int) -> list[int]:
        return batch_order(data.lengths, s.seed, epoch, s.batch_size, s.length_window)

    order = order_of(epoch)
    for _ in range(steps):
        if cursor >= len(order):
            epoch, cursor = epoch + 1, 0
            order = order_of(epoch)
        picked = order[cursor : cursor + s.batch_size]
        cursor += s.batch_size
        mine = picked[rank.rank :: rank.world] or picked[:1]
        batch = collate([data[i] for i in mine], dtype)
        yield epoch, cursor, {k: v.pin_memory() for k, v in batch.items()} if pin else batch


def prefetched(items: Iterator, depth: int = 2) -> Iterator:
    """`items`, produced up to `depth` ahead on a background thread: reading the shards and
    collating overlap the GPU's step. An error there is raised here, at the item it stopped."""
    ready: queue.Queue = queue.Queue(maxsize=depth)

    def produce() -> None:
        try:
            for item in items:
                ready.put((True, item))
            ready.put((True, _END))
        except BaseException as err:  # handed to the consumer, which raises it
            ready.put((False, err))

    threading.Thread(target=produce, daemon=True).start()
    while True:
        ok, item = ready.get()
        if not ok:
            raise item
        if item is _END:
            return
        yield item


_END = object()


def target_seconds(features: TargetFeatures | None) -> float:
    """The seconds spent in the target's forward so far (0 when the features are stored)."""
    return features.seconds if features is not None else 0.0


def on_device(batch: dict, device: torch.device, features: TargetFeatures | None) -> dict:
    """`batch` moved to `device`, with the target's features added there when computed online."""
    moved = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    return features(moved) if features is not None else moved


def _save(path: Path, obj: dict) -> None:
    """Atomically, synced, with its size and sha256 beside it (checked when it is loaded)."""
    with atomic_path(path, _tensor_bytes(obj), checksum=True) as tmp:
        torch.save(obj, tmp)


def _tensor_bytes(obj) -> int:
    """The bytes of the tensors in `obj`: about what torch.save writes."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0
