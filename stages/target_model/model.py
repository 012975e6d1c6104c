"""The target loaded for inference from a local Hugging Face directory (no hub access)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from ..runtime.device import resolve_device, set_cpu_threads

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on a GPU and fp32 on the CPU (bf16 matmuls are slow there)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def load_causal_lm(
    path: str,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    cpu_threads: int | None = None,
):
    """Load a local HF checkpoint for inference (local_files_only: never the hub)."""
    dev = resolve_device(device)
    if dev.type == "cpu":
        set_cpu_threads(cpu_threads)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=resolve_dtype(dtype, dev),
        trust_remote_code=trust_remote_code,
        local_files_only=True,
    )
    return model.to(dev).eval()  # type: ignore[arg-type]  # HF's @wraps'd .to: stub wants self
