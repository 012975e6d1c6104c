"""0.5.23's LogitsProcessorOutput carries the post-norm state beside the aux captures
(`last_hidden_states`) in a capture-only run."""

from __future__ import annotations

from dataclasses import dataclass

from fake_core import LogitsProcessor  # noqa: F401


@dataclass(kw_only=True)
class LogitsProcessorOutput:
    next_token_logits: object
    hidden_states: object = None
    last_hidden_states: object = None
