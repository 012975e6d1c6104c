"""The training loop's knobs, declared once: keys of params.yaml (a section's class inherits these
fields, with their help and ranges) and the loop's settings (TrainingSettings adds what is derived
from the keys). A knob the loop reads is a field of LoopKnobs, one EAGLE-3's objective reads a
field of TTTKnobs, and nowhere else in code. No torch here: the check stage reads these without
loading it."""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.fields import param


@dataclass(frozen=True)
class TTTKnobs:
    """What EAGLE-3's objective (training-time test) and its evaluation read as the user set it."""

    ttt_steps: int = param(7, "Training-time-test unroll (7 in EAGLE-3).", ge=1)
    decay: float = param(0.8, "Weight of TTT step k is decay**k.", gt=0, le=1)
    eval_num_steps: int = param(3, "Chain length of the replayed and simulated acceptance.", ge=1)


@dataclass(frozen=True)
class LoopKnobs:
    """What the training loop (drafter/training.py) reads as the user set it, whichever objective
    it drives."""

    batch_size: int = param(8, "Samples per optimizer step, over all ranks.", ge=1)
    length_window: int = param(
        16,
        "Each run of this many batches is cut from its samples sorted by length, then "
        "shuffled, so batches pad little (1: a plain shuffle).",
        ge=1,
    )
    lr: float = param(1e-4, "Peak learning rate.", gt=0)
    min_lr_ratio: float = param(0.0, "The cosine decays to lr * min_lr_ratio.", ge=0, le=1)
    weight_decay: float = param(0.0, "AdamW weight decay.", ge=0)
    grad_clip: float = param(0.5, "Gradient-norm clip.", gt=0)
    eval_every: int = param(200, "Steps between acceptance evaluations.", ge=1)
    eval_max_samples: int = param(256, "Eval samples per evaluation.", ge=1)
    checkpoint_every: int = param(200, "Steps between checkpoints (the unit of resume).", ge=1)
    seed: int = param(0, "Seed of the initialisation and the sample order.")
    fp8: bool = param(
        False,
        "With compile: the draft's linear products in FP8 e4m3 with row-wise scales while "
        "training (GPUs of compute capability 8.9+); evaluation and export stay bf16.",
    )
