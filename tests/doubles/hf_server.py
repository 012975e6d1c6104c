"""SGLang's HTTP contract served by the in-process HF engine, on a real local port.

`/generate` (input_ids in, output_ids and meta_info out), `/health`, `/model_info` and `/metrics`
behave as SGLang's do (docs/serving.md, section 1), so the sglang engine, the launcher and the
monitor are tested against real sockets without a GPU; `python -m tests.doubles.hf_server` takes
launch_server's flags, so it can stand in for SGLang in a launch. Requests that arrive together are
generated as one HFEngine batch. Fault knobs (dropped connections, 503s, aborts, replies without
output_ids, or every n-th request failing) make the failures the client must survive happen on
purpose. `HashEngine` stands in for the model where only the protocol is under test: thousands of
replies a second, each a pure function of the request (tests/perf/soak_sglang.py).

With SGLang's `--speculative-algorithm EAGLE3 --speculative-draft-model-path D ...` flags it decodes
each request with the drafter (stages.drafter.speculate: one request at a time, built for
counting, not speed) and answers with spec_verify_ct and spec_accept_length in meta_info, as SGLang
does, so the served benchmark is tested against the in-process one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import json
import queue
import random
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
import transformers
from torch import nn

from stages.drafter.export import load_drafter
from stages.drafter.model import Eagle3Drafter, target_facts
from stages.drafter.speculate import SpecResult, speculative_generate
from stages.engines import Completion, FinishReason, Request, Sampling, trim_at_stop
from stages.engines.hf import HFEngine
from stages.serving.launch import EAGLE3
from stages.target_model.model import load_causal_lm

# Sampling values this server honours; the others must be absent, null or neutral.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "stop_token_ids": [],
    "no_stop_trim": False,
    "sampling_seed": 0,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
}
NEUTRAL_SAMPLING = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "n": 1,
    "stop": [],
    "min_new_tokens": 0,
}


class BadRequest(ValueError):
    """What SGLang answers with HTTP 400."""


@dataclass
class Faults:
    """Failures to inject, each counted down as it happens."""

    drop_connections: int = 0  # close new connections before reading a request
    unavailable: int = 0  # answer /generate with 503
    abort: int = 0  # answer /generate with finish_reason abort
    omit_output_ids: bool = False  # reply as SGLang 0.4.x without --skip-tokenizer-init
    # every n-th /generate fails (0: none), by turns a 503 and a connection closed unanswered
    every: int = 0


class HashEngine:
    """The served model's stand-in when only the protocol is under test: a reply's ids are a pure
    function of the prompt ids and the sampling seed (1 to max_new_tokens of them, ending on the
    first stop id when shorter), computed in microseconds, so a soak test sends thousands of
    requests a second and can check every reply against the ids a fault-free run gives."""

    name = "hash"

    def __init__(self, vocab_size: int = 32000, context: int = 1 << 20, batch_size: int = 64):
        self.vocab_size, self.context, self.batch_size = vocab_size, context, batch_size

    def generate(self, requests: list[Request], sampling: Sampling) -> Iterator[Completion]:
        for rid, prompt in requests:
            ids, reason = self.reply(prompt, sampling)
            yield Completion(rid, ids, reason, 0.0)

    def reply(self, prompt: list[int], sampling: Sampling) -> tuple[list[int], FinishReason]:
        rng = random.Random(hashlib.sha256(json.dumps([prompt, sampling.seed]).encode()).digest())
        ids = [
            rng.randrange(self.vocab_size) for _ in range(rng.randint(1, sampling.max_new_tokens))
        ]
        if len(ids) < sampling.max_new_tokens and sampling.stop_ids:
            ids[-1] = sampling.stop_ids[0]
        return trim_at_stop(ids, sampling.stop_ids, sampling.max_new_tokens)


@dataclass(frozen=True)
class Speculative:
    """EAGLE-3 chain drafting (topk 1) in front of the served target, one request at a time."""

    target: transformers.PreTrainedModel
    drafter: Eagle3Drafter
    num_steps: int
    draft_model_path: str = ""

    def decode(self, prompt: list[int], sampling: Sampling) -> SpecResult:
        generator = torch.Generator().manual_seed(sampling.seed)
        embed = self.target.get_input_embeddings()
        if not isinstance(embed, nn.Embedding):
            raise ValueError(
                f"the target's input embedding is a {type(embed).__name__}, not an "
                f"nn.Embedding the drafter can look its tokens up in"
            )
        return speculative_generate(
            self.target,
            self.drafter,
            embed,
            prompt,
            sampling.max_new_tokens,
            self.num_steps,
            sampling.temperature,
            sampling.stop_ids,
            generator,
        )


def load_speculative(
    draft_model_path: str, num_steps: int, target: transformers.PreTrainedModel
) -> Speculative:
    """The exported drafter at `draft_model_path`, checked against the target it will serve."""
    drafter, cfg = load_drafter(draft_model_path)
    facts = target_facts(target.config)
    if (cfg.vocab_size, cfg.target_hidden_size) != (facts.vocab_size, facts.hidden_size):
        raise ValueError(
            f"--speculative-draft-model-path {draft_model_path}: a drafter for "
            f"vocab {cfg.vocab_size} and hidden size {cfg.target_hidden_size}, the "
            f"target has {facts.vocab_size} and {facts.hidden_size}"
        )
    if max(cfg.aux_layer_ids) > facts.num_hidden_layers:
        raise ValueError(
            f"--speculative-draft-model-path {draft_model_path}: trained on hidden "
            f"states {list(cfg.aux_layer_ids)}, the target has "
            f"{facts.num_hidden_layers} layers"
        )
    drafter = drafter.to(next(target.parameters()).device).eval()
    return Speculative(target, drafter, num_steps, str(draft_model_path))


@dataclass
class _Job:
    rid: str
    prompt: list[int]
    sampling: Sampling
    no_stop_trim: bool
    queued_at: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Completion | None = None
    spec: SpecResult | None = None  # the verify steps, when decoded speculatively


def parse_generate(
    body, context_length: int, eos_ids: tuple[int, ...] = ()
) -> tuple[str | None, list[int], Sampling, bool]:
    """Validate a /generate body as SGLang does; return rid, prompt, sampling and no_stop_trim."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    given = [k for k in ("input_ids", "text", "input_embeds") if body.get(k) is not None]
    if len(given) != 1:
        raise BadRequest(f"give exactly one of input_ids, text, input_embeds; got {given}")
    if given[0] != "input_ids":
        raise BadRequest(
            f"{given[0]} is not served here: send input_ids (the server runs as "
            f"with --skip-tokenizer-init)"
        )
    prompt = body["input_ids"]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("input_ids must be a non-empty list of token ids")
    if any(isinstance(t, list) for t in prompt):
        raise BadRequest("batch requests are not served: send one request per sample")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise BadRequest("input_ids must hold integers only")
    if body.get("n", 1) not in (1, None) or body.get("stream"):
        raise BadRequest("n > 1 and stream are not served")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be a JSON object")
    unknown = sorted(set(params) - set(SAMPLING_DEFAULTS) - set(NEUTRAL_SAMPLING))
    if unknown:
        raise BadRequest(f"unknown sampling parameter(s) {unknown}")
    for key, neutral in NEUTRAL_SAMPLING.items():
        if params.get(key) not in (None, neutral):
            raise BadRequest(f"sampling parameter {key}={params[key]!r} is not served")
    value = {k: d if params.get(k) is None else params[k] for k, d in SAMPLING_DEFAULTS.items()}
    max_new = value["max_new_tokens"]
    if len(prompt) >= context_length:
        raise BadRequest(
            f"The input ({len(prompt)} tokens) is longer than the model's context "
            f"length ({context_length} tokens)."
        )
    if len(prompt) + max_new >= context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of "
            f"{len(prompt) + max_new} tokens: {len(prompt)} tokens from the input "
            f"and {max_new} tokens for the completion."
        )
    sampling = Sampling(
        max_new_tokens=max_new,
        temperature=float(value["temperature"]),
        top_p=float(value["top_p"]),
        top_k=int(value["top_k"]),
        seed=int(value["sampling_seed"]),
        stop_ids=tuple(sorted(set(value["stop_token_ids"]) | set(eos_ids))),
    )
    return body.get("rid"), prompt, sampling, bool(value["no_stop_trim"])


def reply(job: _Job, done: Completion, omit_output_ids: bool = False) -> dict:
    """SGLang's non-streaming reply for one finished request."""
    ids = list(done.output_ids)
    if done.finish_reason == "stop":
        finish = {"type": "stop", "matched": ids[-1]}
        if not job.no_stop_trim:
            ids = ids[:-1]
    elif done.finish_reason == "length":
        finish = {"type": "length", "length": job.sampling.max_new_tokens}
    else:
        finish = {
            "type": "abort",
            "message": done.error,
            "status_code": 400,
            "err_type": "BadRequest",
        }
    out: dict[str, Any] = {
        "output_ids": ids,
        "meta_info": {
            "id": job.rid,
            "finish_reason": finish,
            "prompt_tokens": len(job.prompt),
            "completion_tokens": len(done.output_ids),
            "cached_tokens": 0,
            "e2e_latency": round(time.monotonic() - job.queued_at, 6),
        },
    }
    if job.spec is not None and job.spec.verify_steps:
        out["meta_info"].update(spec_meta(job.spec, len(done.output_ids)))
    if omit_output_ids:
        del out["output_ids"]
        out["text"] = ""
    return out


def spec_meta(spec: SpecResult, completion_tokens: int) -> dict:
    """SGLang's speculative meta_info: sent only after at least one verify step; the
    accept length counts every completion token, the prefill's first one included."""
    verify, accepted = spec.verify_steps, sum(spec.accepted)
    return {
        "spec_verify_ct": verify,
        "spec_accept_length": completion_tokens / verify,
        "spec_accept_rate": accepted / (verify * spec.num_steps),
        "spec_accepted_drafts": accepted,
        "spec_proposed_drafts": verify * spec.num_steps,
        "spec_correct_drafts_histogram": [
            spec.accepted.count(k) for k in range(spec.num_steps + 1)
        ],
    }


class HFServer:
    """A running HTTP server; `with HFServer(engine) as server:` gives `server.url`."""

    def __init__(
        self,
        engine: HFEngine | HashEngine | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_path: str = "",
        eos_ids: tuple[int, ...] = (),
        context_length: int | None = None,
        max_running_requests: int | None = None,
        max_queued_requests: int | None = None,
        faults: Faults | None = None,
        gather_s: float = 0.005,
        speculative: Speculative | None = None,
        api_key: str | None = None,
        kv_cache_dtype: str = "auto",
    ):
        self.engine, self.model_path, self.eos_ids = engine, model_path, tuple(eos_ids)
        self.kv_cache_dtype = kv_cache_dtype  # reported as SGLang reports it; the cache here is
        # always the model's dtype
        self.api_key = api_key  # as SGLang's --api-key: a bearer token on every route but
        # /health and /metrics, else 401
        self.speculative = speculative
        self._context_length = context_length
        self.max_running = max_running_requests or (engine.batch_size if engine else 16)
        self.max_queued = max_queued_requests
        self.faults = faults or Faults()
        self.gather_s = gather_s
        self.ready = threading.Event()  # /health answers 503 until set
        if engine is not None:
            self.ready.set()
        self.stats: collections.Counter = collections.Counter()
        self.received: collections.deque = collections.deque(maxlen=4096)  # /generate bodies
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._active: dict[str, _Job] = {}
        self._running = 0
        self._throughput = 0.0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd = _HTTPServer((host, port), _Handler, self)
        self.url = f"http://{host}:{self._httpd.server_address[1]}"
        self._threads: list[threading.Thread] = []

    @property
    def context_length(self) -> int:
        if self._context_length:
            return self._context_length
        if self.engine is None:  # callers ask once the engine is loaded (or check first)
            raise RuntimeError("hf_server: no context length before the engine is loaded")
        return self.engine.context

    @property
    def kv_tokens(self) -> int:
        """What it holds at once, as SGLang's max_total_num_tokens: every running request at
        the full context (1 a request before the engine is loaded)."""
        return self.max_running * (self.context_length if self.engine else 1)

    def start(self) -> HFServer:
        serve = functools.partial(self._httpd.serve_forever, poll_interval=0.05)  # fast stop
        for target in (serve, self._batch_loop):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop as a killed server does: listening socket and open connections closed, requests
        in flight left without a reply."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self._threads:
            self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join()

    def __enter__(self) -> HFServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def generate(self, body) -> tuple[int, dict | None]:
        """Status and reply for one /generate body; None: the server stopped before replying."""
        self.received.append(body)
        with self._lock:
            self.stats["generate"] += 1
            if not self.ready.is_set():
                self.stats["unavailable"] += 1
                return 503, _error("The server is starting.")
            fault = self._fault()
            if fault:
                self.stats[fault] += 1
                if fault == "dropped_connections":
                    return 503, None  # no reply: the handler closes the connection
                return 503, _error("The server is overloaded; retry later.")
            if self.max_queued is not None and self._jobs.qsize() >= self.max_queued:
                self.stats["unavailable"] += 1
                return 503, _error("The request queue is full.")
        try:
            rid, prompt, sampling, no_stop_trim = parse_generate(
                body, self.context_length, self.eos_ids
            )
            if (
                self.speculative
                and sampling.temperature > 0
                and (sampling.top_p < 1 or sampling.top_k > 0)
            ):
                raise BadRequest("top_p and top_k are not served with speculative decoding here")
        except BadRequest as err:
            self._count("bad_request")
            return 400, _error(str(err))
        with self._lock:
            if rid is not None and rid in self._active:
                self.stats["bad_request"] += 1
                return 400, _error(f"Duplicate request ID {rid}: it is still running")
            if self.faults.abort > 0:
                self.faults.abort -= 1
                self.stats["aborted"] += 1
                return 200, {
                    "output_ids": [],
                    "meta_info": {
                        "id": rid,
                        "finish_reason": {"type": "abort", "message": "Aborted by request"},
                        "prompt_tokens": len(prompt),
                        "completion_tokens": 0,
                        "e2e_latency": 0.0,
                    },
                }
            job = _Job(rid or f"req-{self.stats['generate']}", prompt, sampling, no_stop_trim)
            self._active[job.rid] = job
        self._jobs.put(job)
        while not job.done.wait(0.05):
            if self._stopping.is_set():
                break
        with self._lock:
            self._active.pop(job.rid, None)
        if job.result is None:
            return 503, None
        self._count("completed")
        return 200, reply(job, job.result, self.faults.omit_output_ids)

    def _fault(self) -> str | None:
        """The stats key of the fault this /generate request gets, if any (under the lock)."""
        if self.faults.unavailable > 0:
            self.faults.unavailable -= 1
            return "unavailable"
        n, every = self.stats["generate"], self.faults.every
        if every and n % every == 0:
            return "unavailable" if n // every % 2 else "dropped_connections"
        return None

    def _count(self, event: str, n: int = 1) -> None:
        with self._lock:
            self.stats[event] += n

    def model_info(self) -> dict:
        config = getattr(getattr(self.engine, "model", None), "config", None)
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "architectures": getattr(config, "architectures", None),
        }

    def server_info(self) -> dict:
        """The resolved launch settings, as SGLang's /server_info, and this server's version."""
        spec = self.speculative
        flags: dict[str, object] = {
            "speculative_algorithm": None,
            "speculative_draft_model_path": None,
            "speculative_num_steps": None,
            "speculative_eagle_topk": None,
            "speculative_num_draft_tokens": None,
        }
        if spec is not None:
            flags = {
                "speculative_algorithm": EAGLE3,
                "speculative_draft_model_path": spec.draft_model_path,
                "speculative_num_steps": spec.num_steps,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": spec.num_steps + 1,
            }
        model = getattr(self.engine, "model", None)
        return {
            "model_path": self.model_path,
            # the dtype it runs, as SGLang's answer after an explicit --dtype; no quantization
            "dtype": str(model.dtype).removeprefix("torch.") if model is not None else "auto",
            "quantization": None,
            "kv_cache_dtype": self.kv_cache_dtype,
            "max_running_requests": self.max_running,
            "context_length": self.context_length if self.engine else None,
            "max_total_num_tokens": self.kv_tokens,
            **flags,
            "version": f"hf_server (transformers {transformers.__version__})",
            "api_key": self.api_key,  # SGLang's /server_info lists every server arg, this too
        }

    def authorized(self, path: str, authorization: str | None) -> bool:
        """As SGLang's API-key middleware: /health* and /metrics* open, the rest needs the key."""
        if not self.api_key or path.startswith(("/health", "/metrics")):
            return True
        if authorization == f"Bearer {self.api_key}":
            return True
        self._count("unauthorized")
        return False

    def metrics(self) -> str:
        """Prometheus text with the gauges SGLang exposes under --enable-metrics."""
        with self._lock:
            running, queued = self._running, self._jobs.qsize()
            used = sum(len(j.prompt) + j.sampling.max_new_tokens for j in self._active.values())
        label = f'{{model_name="{self.model_path}"}}'
        values = {
            "num_running_reqs": running,
            "num_queue_reqs": queued,
            "token_usage": round(min(used / self.kv_tokens, 1.0), 4),
            "gen_throughput": round(self._throughput, 2),
            "generation_tokens_total": self.stats["generated_tokens"],
        }
        return "".join(f"sglang:{name}{label} {value}\n" for name, value in values.items())

    def _batch_loop(self) -> None:
        """Gather the requests that arrive together into one HF batch per sampling setting."""
        while not self._stopping.is_set():
            try:
                first = self._jobs.get(timeout=0.05)
            except queue.Empty:
                continue
            time.sleep(self.gather_s)
            jobs = [first]
            while len(jobs) < self.max_running:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            groups: dict[Sampling, list[_Job]] = collections.defaultdict(list)
            for job in jobs:
                groups[job.sampling].append(job)
            for sampling, group in groups.items():
                self._run(sampling, group)

    def _run(self, sampling: Sampling, group: list[_Job]) -> None:
        self._running = len(group)
        start, tokens = time.monotonic(), 0
        for job, done in self._decode(sampling, group):
            job.result = done
            tokens += len(done.output_ids)
            job.done.set()
        self._running = 0
        self._throughput = tokens / max(time.monotonic() - start, 1e-9)
        self._count("generated_tokens", tokens)

    def _decode(self, sampling: Sampling, group: list[_Job]) -> Iterator[tuple[_Job, Completion]]:
        """Each job with its completion: one HF batch, or one speculative decode per job."""
        if self.speculative is None:
            if self.engine is None:  # jobs are admitted only once the server is ready
                raise RuntimeError("hf_server: a batch to decode before the engine is loaded")
            by_rid = {job.rid: job for job in group}
            for done in self.engine.generate([(j.rid, j.prompt) for j in group], sampling):
                yield by_rid[done.sample_id], done
            return
        for job in group:
            start = time.monotonic()
            job.spec = self.speculative.decode(job.prompt, sampling)
            ids, reason = trim_at_stop(
                job.spec.output_ids, sampling.stop_ids, sampling.max_new_tokens
            )
            yield job, Completion(job.rid, ids, reason, time.monotonic() - start)

    def _admit(self, conn: socket.socket) -> bool:
        with self._lock:
            if self.faults.drop_connections > 0:
                self.faults.drop_connections -= 1
                self.stats["dropped_connections"] += 1
                return False
            self._connections.add(conn)
            return True

    def _forget(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)


def _error(message: str) -> dict:
    return {"error": {"message": message}}


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024  # the client opens hundreds of connections at once

    def __init__(self, address, handler, app: HFServer):
        self.app = app
        super().__init__(address, handler)

    def verify_request(self, request, client_address) -> bool:
        return self.app._admit(request)

    def shutdown_request(self, request) -> None:
        self.app._forget(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A connection closed under a reply (the client gone, or this server stopping) is what a
        server meets, not an error to print; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as SGLang's uvicorn
    server: _HTTPServer

    def do_GET(self) -> None:
        app = self.server.app
        if not app.authorized(self.path, self.headers.get("Authorization")):
            self._send_json(401, {"error": "Unauthorized"})
        elif self.path in ("/health", "/health_generate"):
            self._send(200 if app.ready.is_set() else 503, b"", "text/plain")
        elif self.path in ("/model_info", "/get_model_info"):
            self._send_json(200, app.model_info())
        elif self.path in ("/server_info", "/get_server_info"):
            self._send_json(200, app.server_info())
        elif self.path == "/metrics":
            self._send(200, app.metrics().encode(), "text/plain; version=0.0.4")
        else:
            self._send_json(404, _error(f"no route {self.path}"))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if not self.server.app.authorized(self.path, self.headers.get("Authorization")):
            self._send_json(401, {"error": "Unauthorized"})
            return
        if self.path != "/generate":
            self._send_json(404, _error(f"no route {self.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError as err:
            self._send_json(400, _error(f"the body is not JSON: {err}"))
            return
        status, payload = self.server.app.generate(body)
        if payload is None:
            self.close_connection = True  # stopped mid-request: no reply, as a killed server
            return
        self._send_json(status, payload)

    def _send_json(self, status: int, payload: dict) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        pass


def model_eos_ids(model) -> tuple[int, ...]:
    """The ids SGLang always stops on unless ignore_eos: the model's own end-of-sequence."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)


def speculative_flags_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the --speculative-* flags, or None."""
    steps, draft_tokens = args.speculative_num_steps, args.speculative_num_draft_tokens
    if args.speculative_algorithm is None:
        return (
            "--speculative-draft-model-path needs --speculative-algorithm EAGLE3"
            if args.speculative_draft_model_path
            else None
        )
    if args.speculative_algorithm != EAGLE3:
        return (
            f"--speculative-algorithm {args.speculative_algorithm}: only {EAGLE3} is "
            f"served here (EAGLE with an EAGLE-3 drafter accepts almost nothing)"
        )
    if not args.speculative_draft_model_path:
        return f"--speculative-algorithm {EAGLE3} needs --speculative-draft-model-path"
    if steps < 1:
        return f"--speculative-num-steps {steps}: draft at least 1 token per step"
    if args.speculative_eagle_topk != 1:
        return (
            f"--speculative-eagle-topk {args.speculative_eagle_topk}: only chains (topk 1) "
            f"are served here"
        )
    if draft_tokens not in (None, steps + 1):
        return (
            f"--speculative-num-draft-tokens {draft_tokens}: a chain of {steps} steps "
            f"verifies {steps + 1} tokens"
        )
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--context-length", type=int)
    parser.add_argument("--max-running-requests", type=int, default=16)
    parser.add_argument("--max-queued-requests", type=int)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto", help="reported in /server_info only")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument(
        "--api-key", help="as SGLang's: requests must carry `Authorization: Bearer <key>`"
    )
    gpu_only = parser.add_argument_group("accepted for launch_server parity, no effect here")
    for flag in (
        "--tp-size",
        "--dp-size",
        "--mem-fraction-static",
        "--hicache-size",
    ):
        gpu_only.add_argument(flag)
    for flag in (
        "--enable-hierarchical-cache",
        "--enable-metrics",
        "--skip-tokenizer-init",
        "--enable-deterministic-inference",
    ):
        gpu_only.add_argument(flag, action="store_true")
    spec = parser.add_argument_group("speculative decoding, as SGLang: EAGLE3 chains (topk 1)")
    spec.add_argument("--speculative-algorithm")
    spec.add_argument("--speculative-draft-model-path")
    spec.add_argument("--speculative-num-steps", type=int, default=3)
    spec.add_argument("--speculative-eagle-topk", type=int, default=1)
    spec.add_argument("--speculative-num-draft-tokens", type=int)
    args = parser.parse_args(argv)
    problem = speculative_flags_problem(args)
    if problem:
        parser.error(problem)

    server = HFServer(
        host=args.host,
        port=args.port,
        model_path=args.model_path,
        context_length=args.context_length,
        max_running_requests=args.max_running_requests,
        max_queued_requests=args.max_queued_requests,
        api_key=args.api_key,
        kv_cache_dtype=args.kv_cache_dtype,
    ).start()
    print(f"hf_server: {server.url} loading {args.model_path}", flush=True)
    model = load_causal_lm(args.model_path, args.device, args.dtype, args.trust_remote_code)
    eos = model_eos_ids(model)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else (eos or (0,))[0]
    server.engine = HFEngine(model, pad, batch_size=args.max_running_requests)
    server.eos_ids = eos
    if args.speculative_algorithm:
        server.speculative = load_speculative(
            args.speculative_draft_model_path, args.speculative_num_steps, model
        )
    server.ready.set()
    print(f"hf_server: {server.url} ready", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
