"""0.5.14's LogitsProcessorOutput holds no post-norm state beside the aux captures."""

from __future__ import annotations

from dataclasses import dataclass

from fake_core import LogitsProcessor  # noqa: F401


@dataclass(kw_only=True)
class LogitsProcessorOutput:
    next_token_logits: object
    hidden_states: object = None
