"""The `benchmark` section: the drafter measured in process or served."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schema import Ranged, Section, check_env_name, param
from .server import SGLangLaunchParams


@dataclass(frozen=True)
class BenchmarkSource(Ranged):
    """An extra prompt file for the benchmark."""

    format: str = param(help="Its format (a source adapter, e.g. mt_bench).")
    path: str = param(help="The file.")
    columns: dict | None = param(None, "Column overrides of the adapter.")


@dataclass(frozen=True)
class BenchmarkSGLangParams(Ranged):
    """The drafter on SGLang: the target served with the drafter and without, measured alike.

    Either attach to running servers (`spec_url` or, for the DFlash benchmark, `dflash_url`, and
    `base_url`) or `launch` them from params, one after the other on the same host and port, so
    they never share the GPUs.
    """

    KEY = "benchmark.sglang"

    spec_url: str | None = param(
        None, "A running server of the target with this drafter (--speculative-algorithm EAGLE3)."
    )
    dflash_url: str | None = param(
        None,
        "A running server of the target with the DFlash drafter (--speculative-algorithm "
        "DFLASH), which the DFlash benchmark measures in place of spec_url.",
    )
    base_url: str | None = param(None, "A running server of the same target without speculation.")
    launch: SGLangLaunchParams | None = param(
        None, "Instead of the urls: start each server in turn (the speculative flags are added)."
    )
    concurrency: int = param(16, "Requests in flight per server while measuring.", ge=1)
    timeout_s: float = param(3600.0, "Longest wait for one reply.", gt=0)
    max_retries: int = param(2, "Retries per request (reported: they cost throughput).", ge=0)
    api_key_env: str | None = param(
        None, "The NAME of the environment variable holding the servers' key."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_env_name(self.api_key_env, "benchmark.sglang.api_key_env")


@dataclass(frozen=True)
class BenchmarkParams(Section):
    """Acceptance length (and, served, speedup) of the trained drafter."""

    KEY = "benchmark"

    mode: Literal["hf", "sglang"] = param(
        "hf", "hf: in-process transformers, no GPU needed; sglang: served, with throughput."
    )
    num_steps: int = param(
        3, "Chain drafting depth (topk 1): num_steps + 1 tokens verified at most.", ge=1
    )
    temperatures: list[float] = param(help="Temperatures measured.", factory=lambda: [0.0, 0.7])
    max_new_tokens: int = param(256, "Reply length per prompt.", ge=1)
    max_prompts: int = param(8, "Prompts per dataset.", ge=1)
    seed: int = param(0, "Sampling seed.")
    datasets: dict[str, BenchmarkSource] = param(
        help="Extra prompt files, e.g. {mt_bench: {format: mt_bench, path: ...}}.", factory=dict
    )
    sglang: BenchmarkSGLangParams = param(
        help="Used when mode is sglang.", factory=BenchmarkSGLangParams
    )
