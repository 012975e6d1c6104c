"""Generation engines: they take prompt token ids and return the raw ids the target produced.

An engine consumes `(sample_id, prompt_ids)` requests lazily and yields completions as they finish,
so the caller can stop feeding requests the moment a token budget is reached. A request stream
may yield None: no request is ready until a completion in flight comes back (a conversation's
next turn waits for its last one); the engine then asks again after the next completion.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

FinishReason = Literal["stop", "length", "abort"]


class EngineError(RuntimeError):
    """An engine or its server cannot go on; the message names the server and the fix."""


@dataclass(frozen=True)
class Sampling:
    """Every sampling value, sent explicitly: servers do not apply generation_config.json."""

    max_new_tokens: int
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocabulary
    seed: int = 0
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Completion:
    sample_id: str
    output_ids: list[int]  # exactly as generated, stop token included
    finish_reason: FinishReason
    latency_s: float
    error: str | None = None  # the engine's message when finish_reason is "abort"


Request = tuple[str, list[int]]  # (sample id, prompt ids)
STALLED = "the request stream waits for a completion, but none is in flight"


class Engine(Protocol):
    name: str

    def generate(
        self, requests: Iterable[Request | None], sampling: Sampling
    ) -> Iterator[Completion]: ...


def ready_batch(requests: Iterator[Request | None], size: int) -> list[Request]:
    """Up to `size` requests, fewer when the stream ends or has none ready (None). For engines
    that wait for a whole batch: nothing of theirs is in flight when they ask, so a stream that
    has none ready then would wait forever."""
    batch: list[Request] = []
    for request in requests:
        if request is None:
            if not batch:
                raise EngineError(STALLED)
            break
        batch.append(request)
        if len(batch) == size:
            break
    return batch


def trim_at_stop(
    ids: list[int], stop_ids: Iterable[int], max_new_tokens: int
) -> tuple[list[int], FinishReason]:
    """Cut a generated row after its first stop token (kept); without one it ran to the limit."""
    stops = set(stop_ids)
    for i, t in enumerate(ids):
        if t in stops:
            return ids[: i + 1], "stop"
    return ids[:max_new_tokens], "length"
