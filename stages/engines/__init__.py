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

from ..runtime.errors import EngineError

FinishReason = Literal["stop", "length", "abort"]


class AuthError(EngineError):
    """A server refused the request for its API key (HTTP 401 or 403): none was sent and the
    server wants one, or the one sent is not the server's. The key itself is never in the text."""


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The `Authorization: Bearer <key>` header SGLang's --api-key checks; none without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def redact(text: str, secret: str | None) -> str:
    """`text` with every occurrence of `secret` (an API key) replaced: a server that echoes a
    request's headers in its error must not put the key into a log, a report or the raw data."""
    return text.replace(secret, "<api key>") if secret else text


def auth_failure(url: str, status: int, answer: str, api_key: str | None) -> AuthError:
    """The error for a 401/403 from `url`, saying whether a key was sent (never which)."""
    sent = (
        "the server refused the API key sent (api_key): check that it is the key the server "
        "was launched with (--api-key)"
        if api_key
        else "no API key was sent (api_key is None) and the server wants one (it was launched "
        "with --api-key)"
    )
    return AuthError(f"{url} answered HTTP {status} ({redact(answer, api_key)}): {sent}")


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
    slots: int  # requests generated at once: a batch, or the requests in flight over all servers

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
