"""The `generate` section: how the target writes the responses, and the servers it writes
them on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schema import Ranged, Section, check_env_name, param
from .server import SGLangLaunchParams


@dataclass(frozen=True)
class SGLangParams(Ranged):
    """The SGLang servers the generate stage sends /generate requests to."""

    KEY = "generate.sglang"

    urls: list[str] = param(
        help="One or more servers (or one sglang_router).",
        factory=lambda: ["http://127.0.0.1:30000"],
    )
    concurrency: int = param(256, "Requests in flight per server.", ge=1)
    timeout_s: float = param(
        3600.0, "Longest wait for one reply (long reasoning takes minutes).", gt=0
    )
    connect_timeout_s: float = param(10.0, "Longest wait for a connection.", gt=0)
    max_retries: int = param(
        8,
        "Retries per request on connection loss, timeouts, 5xx, 408 and 429 (never other 4xx).",
        ge=0,
    )
    backoff_s: float = param(1.0, "First retry delay; doubles per retry, with full jitter.", gt=0)
    backoff_max_s: float = param(60.0, "Longest retry delay.", gt=0)
    launch: SGLangLaunchParams | None = param(
        None, "Start a server for the stage (null: use the servers already at urls)."
    )
    api_key_env: str | None = param(
        None,
        "The NAME of the environment variable holding the servers' key (SGLang's --api-key), "
        "sent as `Authorization: Bearer <key>`; never the key itself (null: no key).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_env_name(self.api_key_env, "generate.sglang.api_key_env")


@dataclass(frozen=True)
class GenerateParams(Section):
    """How the target writes the responses."""

    KEY = "generate"

    engine: Literal["hf", "sglang"] = param(
        "hf", "hf: transformers in-process; sglang: the servers' raw-token /generate."
    )
    batch_size: int = param(16, "Prompts decoded together by the hf engine.", ge=1)
    max_new_tokens: int = param(1024, "Longest reply, in tokens.", ge=1)
    temperature: float = param(0.0, "Sampling temperature (0: greedy).", ge=0)
    top_p: float = param(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = param(-1, "Sample among the k likeliest tokens (-1: the whole vocabulary).", ge=-1)
    seed: int = param(0, "Sampling seed (each sample's own is derived from it).")
    append_every: int = param(
        64, "Samples per atomic append to the output (a kill loses at most these).", ge=1
    )
    sglang: SGLangParams = param(help="Used when engine is sglang.", factory=SGLangParams)
