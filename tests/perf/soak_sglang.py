"""Soak of the sglang engine: many requests against the local SGLang-protocol server
(tests/doubles/hf_server.py with its HashEngine) that fails every 10th /generate (by turns a 503
and a connection closed unanswered) and is restarted mid-run. Every sample must come back exactly
once, with the ids the server's generator gives it (what a fault-free run returns), and the
client's resident memory must stay flat.

    python -m tests.perf.soak_sglang [--requests 20000] [--concurrency 64] [--restarts 2]

The servers are processes forked from this one, so a restart costs no import, and each is stopped
as a killed server is (the connections closed, the requests in flight unanswered); the client runs
in a process of its own, spawned with nothing but the engine and aiohttp imported, so its RSS is
the client's alone. tests/engines/test_soak_sglang.py runs it at this size (under a minute).
"""

from __future__ import annotations

import argparse
import array
import dataclasses
import hashlib
import json
import multiprocessing
import os
import queue
import signal
import socket
import threading
import time
from dataclasses import dataclass

from stages.engines import Sampling
from stages.engines.sglang_http import SGLangEngine, sample_seed

FAULT_EVERY = 10
STOP_ID = 2
SAMPLING = Sampling(max_new_tokens=16, stop_ids=(STOP_ID,))
PROMPT_TOKENS = 32
# Patient enough for a restart: 41 attempts, most up to 1 s apart, about 17 s before a request
# gives up, against a server gone for RESTART_DOWNTIME_S.
RETRIES = dict(max_retries=40, backoff_s=0.05, backoff_max_s=1.0)
RESTART_DOWNTIME_S = 0.5
SERVER_STATS = ("generate", "unavailable", "dropped_connections")  # summed over the servers
# RSS growth allowed from the warm-up to the end, for the full 20,000 requests: a leak of 1 KiB
# per request would show 19 MiB
RSS_GROWTH_MIB = 8.0


@dataclass
class Soak:
    """What one soak run did and saw."""

    requests: int  # samples asked for
    concurrency: int
    restarts: int
    attempts: int  # /generate requests the servers received, retries included
    unavailable: int  # injected 503s
    dropped: int  # injected connections closed unanswered
    retries: int  # failed attempts the client tried again
    missing: int  # samples that never came back
    duplicated: int  # samples that came back more than once
    wrong_ids: int  # samples whose ids or finish reason differ from the generator's
    wall_s: float
    rss_start_mib: float  # the client's, once warmed up
    rss_end_mib: float

    def lines(self) -> list[str]:
        return [
            f"requests {self.requests:,}, {self.concurrency} in flight, {self.restarts} server "
            f"restarts, {self.wall_s:.1f} s ({self.requests / self.wall_s:,.0f} samples/s)",
            f"server: {self.attempts:,} /generate received, {self.unavailable:,} answered 503, "
            f"{self.dropped:,} connections dropped unanswered",
            f"client: {self.retries:,} retries; {self.missing} missing, {self.duplicated} "
            f"duplicated, {self.wrong_ids} with other ids than the fault-free run",
            f"client RSS: {self.rss_start_mib:.1f} MiB after warm-up, {self.rss_end_mib:.1f} MiB "
            f"at the end ({self.rss_end_mib - self.rss_start_mib:+.1f} MiB)",
        ]


def prompt(i: int) -> list[int]:
    return [(i * 7919 + j * 104729) % 32000 for j in range(PROMPT_TOKENS)]


def digest(ids: list[int], finish_reason: str) -> int:
    """A sample's reply in 8 bytes: the client keeps one per sample, never the ids."""
    data = json.dumps([ids, finish_reason]).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_client(url: str, requests: int, concurrency: int, warmup: int, done, results) -> None:
    """The spawned client: every sample through SGLangEngine, each reply folded into a count
    and a digest (memory fixed before the first request); `done` counts the replies."""
    seen = bytearray(requests)
    digests = array.array("Q", bytes(8 * requests))
    engine = SGLangEngine([url], concurrency=concurrency, **RETRIES)
    stream = ((f"soak/{i}", prompt(i)) for i in range(requests))
    rss_start, start = rss_mib(), time.monotonic()
    try:
        for n, reply in enumerate(engine.generate(stream, SAMPLING), 1):
            i = int(reply.sample_id.rsplit("/", 1)[1])
            seen[i] = min(seen[i] + 1, 255)
            digests[i] = digest(reply.output_ids, reply.finish_reason)
            done.value = n
            if n == warmup:
                rss_start = rss_mib()
    except Exception as err:  # handed to the parent, which raises it
        results.put({"error": f"{type(err).__name__}: {err}"})
        return
    results.put(
        {
            "seen": bytes(seen),
            "digests": digests.tobytes(),
            "retries": engine.retries,
            "wall_s": time.monotonic() - start,
            "rss_start_mib": rss_start,
            "rss_end_mib": rss_mib(),
        }
    )


def serve(port: int, stats) -> None:
    """A forked server: HashEngine behind HFServer, failing every FAULT_EVERY-th /generate, until
    SIGTERM; then stopped as a killed server is, its counts added to `stats`."""
    from tests.doubles.hf_server import Faults, HashEngine, HFServer

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    server = HFServer(
        HashEngine(),
        port=port,
        faults=Faults(every=FAULT_EVERY),
        max_running_requests=256,
        gather_s=0.001,
    ).start()
    while not stopping.wait(0.1):
        pass
    server.stop()
    with stats.get_lock():
        for k, key in enumerate(SERVER_STATS):
            stats[k] += server.stats[key]


def expected_digests(requests: int) -> array.array:
    """Each sample's digest as the server's generator makes it: the fault-free run."""
    from tests.doubles.hf_server import HashEngine

    engine = HashEngine()
    out = array.array("Q")
    for i in range(requests):
        sampling = dataclasses.replace(SAMPLING, seed=sample_seed(SAMPLING.seed, f"soak/{i}"))
        out.append(digest(*engine.reply(prompt(i), sampling)))
    return out


def result_of(client, results) -> dict:
    """What the client put in `results`; an error naming its exit code if it ended without."""
    while True:
        try:
            return results.get(timeout=1)
        except queue.Empty:
            if not client.is_alive() and results.empty():
                raise RuntimeError(
                    f"the soak's client ended with exit code {client.exitcode} and no result"
                ) from None


def soak(requests: int = 20000, concurrency: int = 64, restarts: int = 2) -> Soak:
    """Run the soak: the server restarted each time another 1/(restarts + 1) of the samples is
    back, the client's RSS taken after the first tenth (at most 1,000) and at the end."""
    expected = expected_digests(requests)  # imports hf_server: the forked servers import nothing
    fork, spawn = multiprocessing.get_context("fork"), multiprocessing.get_context("spawn")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stats = fork.Array("q", len(SERVER_STATS))

    def start_server():
        server = fork.Process(target=serve, args=(port, stats), daemon=True)
        server.start()
        return server

    def stop(server) -> None:
        server.terminate()
        server.join()

    done, results = spawn.RawValue("q", 0), spawn.Queue()
    server = start_server()
    warmup = min(1000, requests // 10)
    client = spawn.Process(
        target=run_client,
        args=(f"http://127.0.0.1:{port}", requests, concurrency, warmup, done, results),
        daemon=True,
    )
    client.start()
    try:
        for k in range(1, restarts + 1):
            while done.value < k * requests // (restarts + 1) and client.is_alive():
                time.sleep(0.01)
            stop(server)
            time.sleep(RESTART_DOWNTIME_S)
            server = start_server()
        got = result_of(client, results)
        client.join()
    finally:
        client.kill()
        stop(server)
    if "error" in got:
        raise RuntimeError(f"the soak's client failed: {got['error']}")
    seen = got["seen"]
    digests = array.array("Q", got["digests"])
    return Soak(
        requests=requests,
        concurrency=concurrency,
        restarts=restarts,
        attempts=stats[0],
        unavailable=stats[1],
        dropped=stats[2],
        retries=got["retries"],
        missing=seen.count(0),
        duplicated=sum(1 for n in seen if n > 1),
        wrong_ids=sum(1 for a, b in zip(digests, expected) if a != b),
        wall_s=got["wall_s"],
        rss_start_mib=got["rss_start_mib"],
        rss_end_mib=got["rss_end_mib"],
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--restarts", type=int, default=2)
    args = parser.parse_args(argv)
    result = soak(args.requests, args.concurrency, args.restarts)
    for line in result.lines():
        print(line)
    growth = result.rss_end_mib - result.rss_start_mib
    ok = not (result.missing or result.duplicated or result.wrong_ids) and growth < RSS_GROWTH_MIB
    print(
        f"{'PASS' if ok else 'FAIL'}: every sample once with its ids, RSS growth "
        f"{growth:+.1f} MiB (bound {RSS_GROWTH_MIB:g} MiB)"
    )
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
