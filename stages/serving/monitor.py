"""How far a generation run is and how long it will take: live lines while a dataset generates,
and what each dataset has left (the estimate's projection, `projection.py`, reads it too).

The live line shows samples done, generated tokens/s, completions/min, mean output length,
failures, and the ETA of the dataset and of the whole run against the budgets;
servers that expose /metrics (SGLang's --enable-metrics) add running and queued requests and KV
cache use.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..artifacts.raw import parts
from ..engines import Completion, bearer_headers
from ..runtime.progress import hms


@dataclass(frozen=True)
class Backlog:
    """Work a dataset has left: prompts not generated yet, and tokens left in its budget."""

    dataset: str
    prompts_left: int
    tokens_left: int

    def tokens(self, mean_output: float) -> float:
        """Tokens still to generate, when replies average `mean_output` tokens."""
        return min(self.tokens_left, self.prompts_left * mean_output)


def backlog(dataset: str, budget_tokens: int, prompts_path: Path, raw_dir: Path) -> Backlog:
    """A dataset's backlog from its prompt file and the raw parts written so far (a part that
    cannot be read, damaged by a crash, counts as not generated: generate@ deals with it)."""
    prompts = pq.ParquetFile(prompts_path).metadata.num_rows if prompts_path.exists() else 0
    samples = tokens = 0
    if tables := [t for f in parts(raw_dir) if (t := _done(f)) is not None]:
        done = pa.concat_tables(tables)
        samples = pc.count_distinct(done.column("sample_id")).as_py()
        tokens = pc.sum(done.column("completion_tokens")).as_py() or 0
    return Backlog(dataset, max(prompts - samples, 0), max(budget_tokens - tokens, 0))


def _done(part: Path) -> pa.Table | None:
    try:
        return pq.read_table(part, columns=["sample_id", "completion_tokens"])
    except (OSError, pa.ArrowException):
        return None


def run_backlog(budgets: dict[str, int], prompts_dir: Path, raw_dir: Path) -> list[Backlog]:
    return [
        backlog(name, budget, prompts_dir / f"{name}.parquet", raw_dir / name)
        for name, budget in budgets.items()
    ]


def parse_metrics(text: str) -> dict[str, list[float]]:
    """Prometheus text -> values per metric name (one per label set: rank, dp worker...)."""
    values: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        try:
            values.setdefault(name_labels.split("{", 1)[0], []).append(float(value))
        except ValueError:
            continue
    return values


class ServerMetrics:
    """Running and queued requests and KV use summed over servers; a server without /metrics is
    asked once and then left alone."""

    def __init__(self, urls: Iterable[str], timeout_s: float = 2.0, api_key: str | None = None):
        """`api_key`: sent as a bearer token (SGLang leaves /metrics open; a proxy may not)."""
        self.urls, self.timeout_s = list(urls), timeout_s
        self._headers = bearer_headers(api_key)

    def summary(self) -> str | None:
        running = queued = 0.0
        usage = []
        for url in list(self.urls):
            try:
                reply = httpx.get(
                    f"{url}/metrics",
                    timeout=self.timeout_s,
                    trust_env=False,
                    headers=self._headers,
                )
            except httpx.HTTPError:
                continue
            if reply.status_code != 200:
                self.urls.remove(url)
                continue
            m = parse_metrics(reply.text)
            running += sum(m.get("sglang:num_running_reqs", []))
            queued += sum(m.get("sglang:num_queue_reqs", []))
            usage += m.get("sglang:token_usage", [])
        if not usage:
            return None
        return (
            f"servers: running {running:.0f}  queued {queued:.0f}  "
            f"kv {100 * sum(usage) / len(usage):.0f}%"
        )


class GenerationMonitor:
    """Live progress of one dataset's generation, printed every `every_s` seconds."""

    def __init__(
        self,
        dataset: str,
        total_samples: int,
        done_samples: int,
        budget_tokens: int,
        used_tokens: int,
        others: Iterable[Backlog] = (),
        metrics_urls: Iterable[str] = (),
        every_s: float = 10.0,
        stream=None,
        clock: Callable[[], float] = time.monotonic,
        api_key: str | None = None,
    ):
        self.dataset, self.total, self.done_before = dataset, total_samples, done_samples
        self.budget, self.used_before = budget_tokens, used_tokens
        self.others = [b for b in others if b.dataset != dataset]
        self.server = ServerMetrics(metrics_urls, api_key=api_key)
        self.every_s, self.stream, self.clock = every_s, stream, clock
        self.samples = self.tokens = self.failed = 0
        self.start = self.last = clock()

    def update(self, done: Completion) -> None:
        self.samples += 1
        self.tokens += len(done.output_ids)
        self.failed += done.finish_reason == "abort"
        if self.clock() - self.last >= self.every_s:
            self.print()

    def print(self) -> None:
        self.last = self.clock()
        print(self.line(), file=self.stream or sys.stderr, flush=True)

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = self.tokens / elapsed
        mean = self.tokens / self.samples if self.samples else 0.0
        done = self.done_before + self.samples
        used = self.used_before + self.tokens
        mine = Backlog(self.dataset, self.total - done, max(self.budget - used, 0))
        text = (
            f"[generate {self.dataset}] {done}/{self.total} samples  "
            f"{used:,}/{self.budget:,} tokens  {rate:,.0f} tok/s  "
            f"{60 * self.samples / elapsed:,.1f} done/min  mean {mean:,.0f} tok  "
            f"failed {self.failed}  eta {_eta([mine], mean, rate)}  "
            f"run eta {_eta([mine, *self.others], mean, rate)}"
        )
        servers = self.server.summary()
        return f"{text}  {servers}" if servers else text


def _eta(backlogs: list[Backlog], mean_output: float, rate: float) -> str:
    """Time to generate what the backlogs hold at `rate` tokens/s; "?" before any rate."""
    if all(b.prompts_left <= 0 or b.tokens_left <= 0 for b in backlogs):
        return "0:00:00"
    if rate <= 0:
        return "?"
    return hms(sum(b.tokens(mean_output) for b in backlogs) / rate)
