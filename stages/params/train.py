"""The `train` section: the EAGLE-3 draft and its training loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schema import DEVICE, Section, param


@dataclass(frozen=True)
class TrainParams(Section):
    """The EAGLE-3 draft, trained with training-time test."""

    KEY = "train"

    ttt_steps: int = param(7, "Training-time-test unroll (7 in EAGLE-3).", ge=1)
    decay: float = param(0.8, "Weight of TTT step k is decay**k.", gt=0, le=1)
    epochs: float = param(1.0, "Passes over the training split.", gt=0)
    max_steps: int | None = param(None, "Optimizer steps; overrides epochs when set.", ge=1)
    batch_size: int = param(8, "Samples per optimizer step, over all ranks.", ge=1)
    length_window: int = param(
        16,
        "Each run of this many batches is cut from its samples sorted by length, then "
        "shuffled, so batches pad little (1: a plain shuffle).",
        ge=1,
    )
    max_length: int = param(2048, "Longest training sequence, in tokens.", ge=1)
    lr: float = param(1e-4, "Peak learning rate.", gt=0)
    min_lr_ratio: float = param(0.0, "The cosine decays to lr * min_lr_ratio.", ge=0, le=1)
    warmup_ratio: float = param(0.02, "Share of the steps warming up.", ge=0, le=1)
    weight_decay: float = param(0.0, "AdamW weight decay.", ge=0)
    grad_clip: float = param(0.5, "Gradient-norm clip.", gt=0)
    eval_every: int = param(200, "Steps between acceptance evaluations.", ge=1)
    eval_num_steps: int = param(3, "Chain length of the replayed and simulated acceptance.", ge=1)
    eval_max_samples: int = param(256, "Eval samples per evaluation.", ge=1)
    checkpoint_every: int = param(200, "Steps between checkpoints (the unit of resume).", ge=1)
    seed: int = param(0, "Seed of the initialisation and the sample order.")
    device: str = param("auto", "auto | cpu | cuda | cuda:N.", pattern=DEVICE, speed_only=True)
    cpu_threads: int | None = param(
        None, "torch threads on the CPU (null: torch's default).", ge=1, speed_only=True
    )
    compile: Literal["auto", True, False] = param(
        "auto",
        "auto | true: on a GPU, torch.compile the whole objective (TTT unroll, loss, metrics) "
        "into one graph, the first step compiling (reported as warmup_s), eager if that fails; "
        "the CPU runs eager (compiling does not pay there). false: eager everywhere.",
        speed_only=True,
    )
    fp8: bool = param(
        False,
        "With compile: the draft's linear products in FP8 e4m3 with row-wise scales while "
        "training (GPUs of compute capability 8.9+); evaluation and export stay bf16.",
    )
    draft: dict = param(
        help="Overrides of the draft layer's shapes (default: mirror the target; MLA targets: "
        "head_dim 128, kv heads = heads), and rope: mirror | plain.",
        factory=dict,
    )
    sglang_version: str | None = param(
        None,
        "The SGLang release serving the drafter (e.g. '0.5.23'); null: layer ids and rope that "
        "every release serves alike, else refused before training.",
    )
