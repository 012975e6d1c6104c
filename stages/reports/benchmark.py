"""reports/benchmark.json, written by the benchmark stage and read by the report stage.

Two records, one per benchmark.mode, told apart by `engine`: InProcessBenchmark (hf: decoded
here with the drafter and without, one prompt at a time) and ServedBenchmark (sglang: the
target served with the drafter and without). Both hold, per temperature, every prompt set's
acceptance pooled and each set's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from .record import Mismatch, Report, checked

GREEDY = 0.0  # the temperature a drafter's tau is quoted at
IN_PROCESS = "in-process transformers (KV cache)"  # InProcessBenchmark's engine
SERVED = "sglang"  # ServedBenchmark's


@dataclass(frozen=True)
class Acceptance:
    """One prompt set's acceptance at one temperature (or every set's, pooled)."""

    prompts: int
    tau: float | None  # tokens emitted per target verify step; None: no verify step
    # P(draft j accepted | drafts before it were), per position; None where no chain reached j,
    # or (sglang) in place of the list when the server reports no per-draft histogram
    conditional: list[float | None] | None
    unconditional: list[float | None] | None  # P(drafts 1..j all accepted)
    verify_steps: int
    outputs_equal_baseline: int  # prompts whose output plain decoding matched


@dataclass(frozen=True)
class InProcessFigures(Acceptance):
    """hf mode: the drafter against plain decoding of the same target, in this process."""

    tokens: int  # emitted by verify steps (the prefill's first token left out)
    baseline_tau: float  # plain decoding's: one token per forward
    wall_speedup: float | None  # plain decoding's seconds over speculative decoding's


@dataclass(frozen=True)
class InProcessTemperature(InProcessFigures):
    """Every prompt set pooled, and each set's own figures."""

    datasets: dict[str, InProcessFigures]


@dataclass(frozen=True)
class ServedFigures(Acceptance):
    """sglang mode: the speculative server against the base one, at the same concurrency."""

    tau_excluding_prefill: float | None  # as the hf mode counts it
    completion_tokens: int
    spec_tokens_per_s: float | None
    base_tokens_per_s: float | None
    speedup: float | None  # spec_tokens_per_s over base_tokens_per_s
    spec_mean_latency_s: float | None
    base_mean_latency_s: float | None


@dataclass(frozen=True)
class ServedTemperature(ServedFigures):
    """Every prompt set pooled, and each set's own figures."""

    datasets: dict[str, ServedFigures]


def greedy_tau(temperatures: Mapping[float, Acceptance]) -> float | None:
    """tau at GREEDY, the figure a run is quoted by (None: not benchmarked at it)."""
    greedy = temperatures.get(GREEDY)
    return greedy.tau if greedy else None


@dataclass(frozen=True)
class InProcessBenchmark(Report):
    """benchmark.mode hf."""

    STAGE: ClassVar[str] = "benchmark"

    num_steps: int  # chain depth
    topk: int
    mode: Literal["chain"]
    engine: Literal["in-process transformers (KV cache)"]
    temperatures: dict[float, InProcessTemperature]
    tau_greedy: float | None  # greedy_tau(temperatures)
    sglang_launch: str  # how SGLang serves the same drafter


@dataclass(frozen=True)
class ServedBenchmark(Report):
    """benchmark.mode sglang: both servers' facts beside the figures."""

    STAGE: ClassVar[str] = "benchmark"

    num_steps: int
    topk: int
    mode: Literal["chain"]
    engine: Literal["sglang"]
    engine_version: str | None  # the speculative server's, as it reports it
    concurrency: int
    tau_convention: str  # how SGLang counts tau, said beside it
    servers: dict[str, dict[str, Any]]  # spec, base: url, command and what /server_info says
    temperatures: dict[float, ServedTemperature]
    tau_greedy: float | None


BenchmarkReport = InProcessBenchmark | ServedBenchmark


def read_benchmark(path: Path | str) -> BenchmarkReport:
    """The report at `path`, as the record its `engine` names."""
    return checked(InProcessBenchmark, path, _parse)


def _parse(data: object) -> BenchmarkReport:
    engine = data.get("engine") if isinstance(data, dict) else IN_PROCESS
    if engine not in (IN_PROCESS, SERVED):
        raise Mismatch("engine", f"{json.dumps(engine)} is neither {IN_PROCESS!r} nor {SERVED!r}")
    return (ServedBenchmark if engine == SERVED else InProcessBenchmark).from_json(data)
