"""How fast the sglang engine's client is on its own: completed requests/s with 512 in flight on
one core, and the client's overhead per request, against a zero-latency stub server that answers
every /generate with canned output_ids. The stub runs in another process on another core, so the
figures are the client's.

    .venv/bin/python -m tests.perf.bench_sglang_client [--requests 20000] [--prompt-tokens 512]

The issue asks for at least 1,000 completed requests/s at 512 in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import time

from stages.engines import Sampling
from stages.engines.sglang_http import SGLangEngine

TARGET_PER_S = 1000


def canned_reply(output_tokens: int) -> bytes:
    body = json.dumps(
        {
            "text": "",
            "output_ids": list(range(1000, 1000 + output_tokens)),
            "meta_info": {
                "id": "stub",
                "prompt_tokens": 0,
                "finish_reason": {"type": "length", "length": output_tokens},
                "completion_tokens": output_tokens,
                "e2e_latency": 0.0,
            },
        }
    )
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body.encode(),
    )


class StubProtocol(asyncio.Protocol):
    """HTTP/1.1 keep-alive: answer each complete request (headers + Content-Length body)."""

    def __init__(self, answer: bytes):
        self.answer, self.buffer = answer, b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(self.answer)


def serve_stub(sock: socket.socket, output_tokens: int, core: int | None) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    answer = canned_reply(output_tokens)

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(
            lambda: StubProtocol(answer), sock=sock, backlog=2048
        )
        await server.serve_forever()

    asyncio.run(serve())


def measure(
    url: str, requests: int, concurrency: int, prompt_tokens: int, sampling: Sampling
) -> tuple[float, float, int]:
    """Completed requests/s, client CPU µs per request, output tokens received."""
    engine = SGLangEngine([url], concurrency=concurrency, max_retries=0)
    prompt = list(range(100, 100 + prompt_tokens))
    stream = ((f"bench/{i}", prompt) for i in range(requests))
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = sum(len(c.output_ids) for c in engine.generate(stream, sampling))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return requests / wall, cpu / requests * 1e6, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=256)
    args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    client_core, stub_core = cores[0], (cores[1] if len(cores) > 1 else None)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    stub = multiprocessing.Process(
        target=serve_stub, args=(sock, args.output_tokens, stub_core), daemon=True
    )
    stub.start()
    os.sched_setaffinity(0, {client_core})
    sampling = Sampling(max_new_tokens=args.output_tokens, stop_ids=(2,))
    print(
        f"client on core {client_core}, stub on core {stub_core}; prompts of "
        f"{args.prompt_tokens} tokens, replies of {args.output_tokens} output_ids"
    )
    print(
        f"{'in flight':>10}{'requests':>10}{'completed/s':>13}{'client CPU µs/req':>19}"
        f"{'wall µs/req':>13}"
    )
    try:
        measure(url, 1000, 64, args.prompt_tokens, sampling)  # warm-up
        for concurrency, requests in ((512, args.requests), (64, args.requests // 2), (1, 2000)):
            rate, cpu_us, tokens = measure(url, requests, concurrency, args.prompt_tokens, sampling)
            assert tokens == requests * args.output_tokens
            print(
                f"{concurrency:>10}{requests:>10}{rate:>13,.0f}{cpu_us:>19,.0f}{1e6 / rate:>13,.0f}"
            )
            if concurrency == 512:
                verdict = "meets" if rate >= TARGET_PER_S else "MISSES"
                summary = (
                    f"512 in flight: {rate:,.0f} completed requests/s, {verdict} the "
                    f"{TARGET_PER_S:,}/s target"
                )
    finally:
        stub.terminate()
    print(summary)


if __name__ == "__main__":
    main()
