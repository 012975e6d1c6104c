"""reports/benchmark.json (EAGLE-3) and reports/benchmark_dflash.json (DFlash), written by the
benchmark stages and read by the report stage.

Two records, one per benchmark.mode, told apart by `engine`: InProcessBenchmark (hf: decoded
here with the drafter and without, one prompt at a time) and ServedBenchmark (sglang: the
target served with the drafter and without). Both hold, per temperature, every prompt set's
acceptance pooled and each set's own, and the tokens the target verifies per step (an EAGLE-3
chain: num_steps + 1; DFlash: its block size), so two drafters are compared at equal width. The
DFlash stage writes the same records under its own stage name (DFlashInProcessBenchmark,
DFlashServedBenchmark), so a stale file names the stage to rerun. Where train_dflash trained
no drafter (extract.drafters leaves out dflash), the DFlash stage writes NotTrained instead:
`read_dflash_benchmark` reads either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from .record import Mismatch, Report, checked

GREEDY = 0.0  # the temperature a drafter's tau is quoted at
Drafter = Literal["EAGLE-3", "DFlash"]
Drafting = Literal["chain", "block"]  # EAGLE-3: a chain of drafts; DFlash: a block at once
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

    drafter: Drafter
    num_steps: int  # drafts per verify step (EAGLE-3: chain depth; DFlash: block_size - 1)
    tokens_verified_per_step: int  # num_steps + 1: the width drafters compare at
    topk: int
    mode: Drafting
    engine: Literal["in-process transformers (KV cache)"]
    temperatures: dict[float, InProcessTemperature]
    tau_greedy: float | None  # greedy_tau(temperatures)
    sglang_launch: str  # how SGLang serves the same drafter


@dataclass(frozen=True)
class ServedBenchmark(Report):
    """benchmark.mode sglang: both servers' facts beside the figures."""

    STAGE: ClassVar[str] = "benchmark"

    drafter: Drafter
    num_steps: int
    tokens_verified_per_step: int
    topk: int
    mode: Drafting
    engine: Literal["sglang"]
    engine_version: str | None  # the speculative server's, as it reports it
    concurrency: int
    tau_convention: str  # how SGLang counts tau, said beside it
    servers: dict[str, dict[str, Any]]  # spec, base: url, command and what /server_info says
    temperatures: dict[float, ServedTemperature]
    tau_greedy: float | None


@dataclass(frozen=True)
class DFlashInProcessBenchmark(InProcessBenchmark):
    STAGE: ClassVar[str] = "benchmark_dflash"


@dataclass(frozen=True)
class DFlashServedBenchmark(ServedBenchmark):
    STAGE: ClassVar[str] = "benchmark_dflash"


@dataclass(frozen=True)
class NotTrained(Report):
    """benchmark_dflash with no drafter to measure (train_dflash left models/dflash empty): the
    report stage prints the reason where the figures would be, rather than failing the run."""

    STAGE: ClassVar[str] = "benchmark_dflash"

    drafter: Drafter
    trained: Literal[False]
    reason: str  # why there is no drafter, and what would train one

    @property
    def line(self) -> str:
        """What the page and the model card say in place of the family's figures."""
        return f"{self.drafter}: not trained ({self.reason})"


BenchmarkReport = InProcessBenchmark | ServedBenchmark
Records = tuple[type[InProcessBenchmark], type[ServedBenchmark]]  # a stage's (hf, sglang) records
EAGLE3_RECORDS: Records = (InProcessBenchmark, ServedBenchmark)
DFLASH_RECORDS: Records = (DFlashInProcessBenchmark, DFlashServedBenchmark)


def _measured(data: object, records: Records) -> BenchmarkReport:
    """`data` as the record of `records` its `engine` names, or Mismatch."""
    in_process, served = records
    engine = data.get("engine") if isinstance(data, dict) else IN_PROCESS
    if engine not in (IN_PROCESS, SERVED):
        raise Mismatch("engine", f"{json.dumps(engine)} is neither {IN_PROCESS!r} nor {SERVED!r}")
    return (served if engine == SERVED else in_process).from_json(data)


def read_benchmark(path: Path | str, records: Records = EAGLE3_RECORDS) -> BenchmarkReport:
    """The report at `path`, as the record of `records` its `engine` names."""
    return checked(records[0], path, lambda data: _measured(data, records))


def read_dflash_benchmark(path: Path | str) -> BenchmarkReport | NotTrained:
    """benchmark_dflash's report: NotTrained where the file says `trained` (only NotTrained has
    that key), else the figures, as read_benchmark reads them."""

    def parse(data: object) -> BenchmarkReport | NotTrained:
        if isinstance(data, dict) and "trained" in data:
            return NotTrained.from_json(data)
        return _measured(data, DFLASH_RECORDS)

    return checked(NotTrained, path, parse)
