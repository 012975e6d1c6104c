"""The `target` section: the model whose outputs the drafter learns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schema import DEVICE, Section, param


@dataclass(frozen=True)
class TargetParams(Section):
    """The model whose outputs the drafter learns."""

    KEY = "target"

    path: str = param(help="Local Hugging Face directory of the target (weights and tokenizer).")
    chat_template: str | None = param(
        None, "A Jinja chat-template file, for models that ship none (null: the model's own)."
    )
    template_kwargs: dict = param(
        help="Passed to apply_chat_template, e.g. {thinking: true}.", factory=dict
    )
    roles: dict = param(
        help="Token-role overrides (role -> token string, e.g. {end_of_turn: '<|im_end|>'}); "
        "the rest is learned from the tokenizer.",
        factory=dict,
    )
    trust_remote_code: bool = param(False, "Run the model's own code from its directory.")
    device: str = param("auto", "auto | cpu | cuda | cuda:N.", pattern=DEVICE)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = param(
        "auto", "auto (bf16 on a GPU, fp32 on the CPU) | float32 | bfloat16 | float16."
    )
    cpu_threads: int | None = param(None, "torch threads on the CPU (null: torch's default).", ge=1)
