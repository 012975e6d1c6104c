"""The SGLang engine: prompt ids to SGLang's native /generate, the raw output ids back.

One HTTP request per sample (a batch request fails whole on one bad item and `n > 1` loses the
rids), many in flight per server, several servers. The asyncio loop runs inside `generate`, so the
caller sees a plain iterator, and a request is pulled from the caller's iterator only when a slot
is free: a token budget stops the stream after the completions already counted.

Token ids go in and come out; a reply without `output_ids` is an error, never a reason to
re-tokenize text. The HTTP client is aiohttp: httpx 0.28's connection pool scans every connection
per request and managed about 140 requests/s at 512 in flight on one core (600/s split over 512
one-connection clients), where this engine must keep more than 1,000/s
(tests/perf/bench_sglang_client.py measures it).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import hashlib
import json
import random
import time
from collections.abc import Generator, Iterable, Iterator
from typing import NamedTuple

import aiohttp
import httpx

from . import (
    STALLED,
    Completion,
    EngineError,
    Request,
    Sampling,
    auth_failure,
    bearer_headers,
    redact,
)

# Worth another try: the server is starting, overloaded or gone. 408 and 429 are what
# sglang_router answers when its own queue is full or timed out, so they mean "later" too.
RETRY_STATUS = frozenset({408, 429})
AUTH_STATUS = frozenset({401, 403})  # SGLang's --api-key answers 401: never retried
JSON_HEADERS = {"Content-Type": "application/json"}
INFO_PATHS = ("/server_info", "/get_server_info")  # the second is the older name
# What a server's /server_info says that shapes its tokens, under the generation facts' names.
SERVED_FACTS = {
    "served_model": "model_path",
    "dtype": "dtype",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
}
# What it says of its capacity: the longest sequence (None: the model's own), the tokens its KV
# cache holds over all running requests (the scheduler's max_total_num_tokens) and the requests
# it runs at once (None: as many as that cache holds).
SERVED_LIMITS = {
    "context_length": "context_length",
    "kv_cache_tokens": "max_total_num_tokens",
    "max_running_requests": "max_running_requests",
}


def get_json(url: str, api_key: str | None, timeout_s: float) -> object:
    """The JSON a GET of `url` answers, None for another status or a body that is not JSON;
    AuthError when the server refuses `api_key` (or its absence). A server that is not there
    raises httpx.HTTPError."""
    response = httpx.get(url, timeout=timeout_s, trust_env=False, headers=bearer_headers(api_key))
    if response.status_code in AUTH_STATUS:
        raise auth_failure(url, response.status_code, response.text[:200], api_key)
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def server_info(url: str, api_key: str | None = None, timeout_s: float = 10.0) -> dict:
    """A server's resolved launch settings (/server_info, or its older name); {} when it has
    neither. SGLang's answer holds its --api-key too: never print it whole."""
    for path in INFO_PATHS:
        answer = get_json(f"{url}{path}", api_key, timeout_s)
        if isinstance(answer, dict):
            return answer
    return {}


class _End(enum.Enum):
    END = "end"  # the request stream is exhausted


_END = _End.END


class SGLangError(EngineError):
    """The servers cannot produce the tokens; the message says which server and what to change."""


class _Retry(Exception):
    """One attempt failed in a way another attempt may not."""


class Reply(NamedTuple):
    """A completion with the server's meta_info (e2e_latency, spec_verify_ct...), to measure it."""

    completion: Completion
    meta_info: dict


def request_body(sample_id: str, prompt_ids: list[int], sampling: Sampling, attempt: int) -> dict:
    """The /generate body: every sampling value explicit (servers skip generation_config.json).

    The rid is the sample id plus the attempt number: stable across runs, so a sample can be
    found in the server's logs, and unique among retries, since SGLang refuses a rid in use.
    """
    return {
        "rid": f"{sample_id}#{attempt}",
        "input_ids": prompt_ids,
        "stream": False,
        "sampling_params": {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "stop_token_ids": list(sampling.stop_ids),
            "ignore_eos": False,
            "skip_special_tokens": False,
            "no_stop_trim": True,  # keep the stop token in output_ids
            "sampling_seed": sample_seed(sampling.seed, sample_id),
            "n": 1,
        },
    }


def sample_seed(seed: int, sample_id: str) -> int:
    """A per-sample seed, so a resumed run samples what the first run would have."""
    digest = hashlib.sha256(f"{seed}:{sample_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def parse_reply(reply: dict, sample_id: str, url: str, latency_s: float) -> Completion:
    """A /generate reply as a Completion; a reply that cannot be trusted token for token raises."""
    if not isinstance(reply, dict) or reply.get("output_ids") is None:
        raise SGLangError(
            f"{url}/generate answered sample {sample_id} without output_ids, so the generated "
            f"token ids are unknown (text is never re-tokenized). SGLang 0.4.x returns output_ids "
            f"only when launched with --skip-tokenizer-init: add that flag (the launch's "
            f"server_args.skip_tokenizer_init: true) or upgrade to "
            f"SGLang >= 0.5. Reply keys: {sorted(reply) if isinstance(reply, dict) else reply!r}"
        )
    ids = reply["output_ids"]
    meta = reply.get("meta_info") or {}
    finish = meta.get("finish_reason") or {}
    if not isinstance(finish, dict):
        finish = {"type": finish}
    kind = finish.get("type")
    latency = float(meta.get("e2e_latency") or latency_s)
    if kind == "abort":
        return Completion(
            sample_id,
            ids,
            "abort",
            latency,
            error=f"{url}: {finish.get('message') or 'aborted by the server'}",
        )
    if kind not in ("stop", "length"):
        raise SGLangError(
            f"{url}/generate: sample {sample_id} finished with {kind!r}; expected "
            f"finish_reason type stop, length or abort in meta_info"
        )
    matched = finish.get("matched")
    if kind == "stop" and isinstance(matched, int) and (not ids or ids[-1] != matched):
        raise SGLangError(
            f"{url}/generate: sample {sample_id} stopped on token {matched} but "
            f"output_ids do not end with it; the server ignored no_stop_trim, which "
            f"would drop every stop token from the data"
        )
    return Completion(sample_id, ids, kind, latency)


def error_message(body: bytes) -> str:
    """The server's own words from an error reply: SGLang sends {"error": {"message": ...}}."""
    text = body.decode(errors="replace")
    try:
        error = json.loads(text).get("error", text)
    except (ValueError, AttributeError):
        return text.strip()[:500]
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error)[:500]


async def _shut_down(
    in_flight: list[asyncio.Task], unread: Iterable[asyncio.Task], session: aiohttp.ClientSession
) -> None:
    """Cancel what is in flight (a rerun sends it again), let go of finished results nobody
    will read (failures included) and close the connections."""
    for task in in_flight:
        task.cancel()
    await asyncio.gather(*in_flight, *unread, return_exceptions=True)
    await session.close()


class SGLangEngine:
    """Many requests in flight over several SGLang servers, with retries, as an Engine."""

    name = "sglang"

    def __init__(
        self,
        urls: list[str],
        concurrency: int = 256,
        timeout_s: float = 3600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 8,
        backoff_s: float = 1.0,
        backoff_max_s: float = 60.0,
        api_key: str | None = None,
    ):
        """`api_key`: sent as `Authorization: Bearer <key>` (SGLang's --api-key); it never
        appears in an error, a completion's error text or the engine's repr."""
        if not urls:
            raise ValueError("urls: give at least one server URL")
        if concurrency < 1:
            raise ValueError(f"concurrency: {concurrency} must be at least 1")
        self.urls = [u.rstrip("/") for u in urls]
        self.concurrency, self.max_retries = concurrency, max_retries
        self.slots = concurrency * len(self.urls)
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.in_flight = dict.fromkeys(self.urls, 0)  # requests sent and not yet answered
        self.retries = 0  # failed attempts that were tried again, over the engine's life
        self._jitter = random.Random()
        self._api_key = api_key or None
        self._headers = {**JSON_HEADERS, **bearer_headers(self._api_key)}

    def generate(
        self, requests: Iterable[Request | None], sampling: Sampling
    ) -> Iterator[Completion]:
        replies = self.replies(requests, sampling)
        try:
            for reply in replies:
                yield reply.completion
        finally:
            replies.close()

    def replies(
        self, requests: Iterable[Request | None], sampling: Sampling
    ) -> Generator[Reply, None, None]:
        """As `generate`, each completion with the meta_info its server sent."""
        loop = asyncio.new_event_loop()
        session = loop.run_until_complete(self._open_session())
        tasks: set[asyncio.Task] = set()
        finished: collections.deque[asyncio.Task] = collections.deque()
        wakeup = loop.create_future()

        def on_done(task: asyncio.Task) -> None:
            tasks.discard(task)
            finished.append(task)
            if not wakeup.done():
                wakeup.set_result(None)

        pending = iter(requests)
        exhausted = False
        try:
            while True:
                while not exhausted and len(tasks) < self.slots:
                    request = next(pending, _END)
                    if request is _END:
                        exhausted = True
                    if request is _END or request is None:  # None: ask again after a reply
                        break
                    task = loop.create_task(self._complete(session, *request, sampling))
                    task.add_done_callback(on_done)
                    tasks.add(task)
                if not finished:
                    if not tasks:
                        if not exhausted:
                            raise EngineError(STALLED)
                        return
                    wakeup = loop.create_future()
                    loop.run_until_complete(wakeup)
                yield finished.popleft().result()
        finally:
            loop.run_until_complete(_shut_down(list(tasks), finished, session))
            loop.close()

    async def _open_session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.connect_timeout_s, sock_read=self.timeout_s
        )
        return aiohttp.ClientSession(connector=connector, timeout=timeout)

    async def _complete(
        self,
        session: aiohttp.ClientSession,
        sample_id: str,
        prompt_ids: list[int],
        sampling: Sampling,
    ) -> Reply:
        failures = []
        url = None
        for attempt in range(self.max_retries + 1):
            url = self._pick_url(avoid=url)
            try:
                return await self._attempt(session, url, sample_id, prompt_ids, sampling, attempt)
            except _Retry as failure:
                failures.append(str(failure))
            if attempt < self.max_retries:
                self.retries += 1
                await asyncio.sleep(self._backoff(attempt))
        raise SGLangError(
            f"sample {sample_id}: {len(failures)} attempts failed, the last: {failures[-1]}. "
            f"Check that the servers ({', '.join(self.urls)}) are up (their /health answers 200), "
            f"or raise max_retries / backoff_max_s to wait out a restart; "
            f"the samples already done are kept and a rerun resumes after them"
        )

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        url: str,
        sample_id: str,
        prompt_ids: list[int],
        sampling: Sampling,
        attempt: int,
    ) -> Reply:
        body = json.dumps(request_body(sample_id, prompt_ids, sampling, attempt)).encode()
        start = time.monotonic()
        self.in_flight[url] += 1
        try:
            async with session.post(f"{url}/generate", data=body, headers=self._headers) as reply:
                status, payload = reply.status, await reply.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as err:
            raise _Retry(self._redact(f"{url}: {type(err).__name__}: {err}")) from None
        finally:
            self.in_flight[url] -= 1
        latency = time.monotonic() - start
        if status == 200:
            try:
                reply_json = json.loads(payload)
            except ValueError:
                raise _Retry(
                    self._redact(f"{url}: a reply that is not JSON: {payload[:200]!r}")
                ) from None
            try:
                completion = parse_reply(reply_json, sample_id, url, latency)
            except SGLangError as err:
                raise SGLangError(self._redact(str(err))) from None
            if completion.error:
                completion = dataclasses.replace(completion, error=self._redact(completion.error))
            return Reply(completion, reply_json.get("meta_info") or {})
        answer = self._redact(error_message(payload))
        if status in AUTH_STATUS:
            raise auth_failure(f"{url}/generate", status, answer, self._api_key)
        if status >= 500 or status in RETRY_STATUS:
            raise _Retry(f"{url}: HTTP {status}: {answer}")
        return Reply(
            Completion(sample_id, [], "abort", latency, error=f"{url}: HTTP {status}: {answer}"),
            {},
        )

    @property
    def api_key(self) -> str | None:
        """The key sent with every request (for the monitor's /metrics); never printed."""
        return self._api_key

    def facts(self) -> dict:
        """What the servers report that shapes their tokens (SERVED_FACTS; None where a server
        does not say), the same for all of them: servers launched otherwise refuse the run."""
        reported = self._reported(SERVED_FACTS)
        first = reported[self.urls[0]]
        if any(facts != first for facts in reported.values()):
            raise SGLangError(
                f"the servers report different models or settings ({reported}): one dataset's "
                f"replies must come from one target; launch them alike"
            )
        return first

    def limits(self) -> dict[str, dict]:
        """Each server's SERVED_LIMITS (None where it does not say), by URL."""
        return self._reported(SERVED_LIMITS)

    def _reported(self, keys: dict[str, str]) -> dict[str, dict]:
        """Each server's /server_info `keys` (ours: theirs), None where it does not say."""
        reported = {}
        for url in self.urls:
            try:
                info = server_info(url, self._api_key, self.connect_timeout_s)
            except httpx.HTTPError as err:
                raise SGLangError(
                    f"{url}/server_info: {type(err).__name__}: {self._redact(str(err))}. Check "
                    f"that the servers ({', '.join(self.urls)}) are up"
                ) from None
            reported[url] = {name: info.get(key) for name, key in keys.items()}
        return reported

    def _redact(self, text: str) -> str:
        return redact(text, self._api_key)

    def _pick_url(self, avoid: str | None) -> str:
        """The server with the fewest requests in flight; a retry goes elsewhere when it can."""
        urls = [u for u in self.urls if u != avoid] or self.urls
        return min(urls, key=self.in_flight.__getitem__)

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with full jitter, so retrying clients do not arrive in step."""
        return self._jitter.uniform(0, min(self.backoff_max_s, self.backoff_s * 2**attempt))
