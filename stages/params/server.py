"""A SGLang server launched from params: what the generate and the benchmark sections share."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Ranged, param


@dataclass(frozen=True)
class SGLangServerArgs(Ranged):
    """Flags of `python -m sglang.launch_server`, named as SGLang names them (null: its default);
    each set key becomes `--key-name value`, `true` a bare flag."""

    host: str = param("127.0.0.1", "The address the server binds.")
    port: int = param(30000, "Its port.", ge=1, le=65535)
    tp_size: int = param(1, "Tensor-parallel GPUs per server.", ge=1)
    dp_size: int = param(1, "Data-parallel replicas inside the server.", ge=1)
    mem_fraction_static: float | None = param(
        None, "GPU memory share for weights and the KV cache.", gt=0, le=1
    )
    context_length: int | None = param(None, "The longest prompt + reply.", ge=1)
    max_running_requests: int | None = param(None, "Requests decoded at once.", ge=1)
    kv_cache_dtype: str = param("auto", "auto | bf16 | fp8_e4m3 | ...")
    enable_hierarchical_cache: bool = param(False, "Spill the KV cache to host memory.")
    hicache_size: int | None = param(
        None, "GB of host memory per rank for the hierarchical cache.", ge=1
    )
    enable_metrics: bool = param(True, "Serve /metrics (the generate stage's monitor reads it).")
    skip_tokenizer_init: bool = param(False, "No tokenizer in the server (ids only).")


@dataclass(frozen=True)
class SGLangLaunchParams(Ranged):
    """Start one server for the stage and stop it when the stage ends."""

    model_path: str | None = param(None, "What the server serves (null: target.path).")
    module: str = param(
        "sglang.launch_server",
        "The server's module (tests put their stand-in, tests.doubles.hf_server, here).",
    )
    server_args: SGLangServerArgs = param(help="The server's flags.", factory=SGLangServerArgs)
    extra_args: list[str] = param(
        help="Any other launch_server flags, e.g. [--chunked-prefill-size, '8192'].", factory=list
    )
    health_timeout_s: float = param(1800.0, "Longest wait for /health after the start.", gt=0)
    log_file: str | None = param(None, "The server's log (null: a temporary file, printed).")
