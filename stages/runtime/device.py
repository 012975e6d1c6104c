"""Where tensors go: the device an `auto` setting means here, and torch's CPU threads."""

from __future__ import annotations

import torch


def resolve_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def set_cpu_threads(threads: int | None) -> None:
    """Pin torch's CPU threads. On a small machine one thread per process avoids the slowdown of
    threads spinning against another busy process, many times slower per decode step
    (docs/performance.md)."""
    if threads:
        torch.set_num_threads(threads)
