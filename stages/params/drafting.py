"""The keys every section that trains a drafter holds (`train`: EAGLE-3, `dflash`: DFlash),
declared once: the training loop's own knobs (LoopKnobs' fields, stages/drafter/knobs.py), how
many steps, on what, and which SGLang release serves the export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..drafter.knobs import LoopKnobs
from .schema import DEVICE, param


@dataclass(frozen=True)
class DrafterKeys(LoopKnobs):
    """A drafter's training run and its export, whichever the drafter."""

    KEY: ClassVar[str]  # the section the keys are read under (`train`, `dflash`)

    epochs: float = param(1.0, "Passes over the training split.", gt=0)
    max_steps: int | None = param(None, "Optimizer steps; overrides epochs when set.", ge=1)
    max_length: int = param(2048, "Longest training sequence, in tokens.", ge=1)
    warmup_ratio: float = param(0.02, "Share of the steps warming up.", ge=0, le=1)
    device: str = param("auto", "auto | cpu | cuda | cuda:N.", pattern=DEVICE, speed_only=True)
    cpu_threads: int | None = param(
        None, "torch threads on the CPU (null: torch's default).", ge=1, speed_only=True
    )
    compile: Literal["auto", True, False] = param(
        "auto",
        "auto | true: on a GPU, torch.compile the whole objective (the drafter's forward, loss, "
        "metrics) into one graph, the first step compiling (reported as warmup_s), eager if that "
        "fails; the CPU runs eager (compiling does not pay there). false: eager everywhere.",
        speed_only=True,
    )
    draft: dict = param(
        help="Overrides of the draft layers' shapes (default: mirror the target; MLA targets: "
        "head_dim 128, kv heads = heads), and rope: mirror | plain.",
        factory=dict,
    )
    sglang_version: str | None = param(
        None,
        "The SGLang release serving the drafter (e.g. '0.5.23'); null: layer ids and rope that "
        "every release serves alike, else refused before training.",
    )
