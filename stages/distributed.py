"""Process-group set-up for the stages torchrun launches (extract, train): one place that reads
the torchrun environment, applies the NCCL settings the project needs, and picks each rank's GPU."""
from __future__ import annotations

import os

import torch

from .drafter.training import Rank
from .engines.sglang_server import NCCL_ENV


def start(device: torch.device) -> tuple[Rank, torch.device]:
    """(this process's rank, its device); a no-op outside torchrun."""
    rank = Rank(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    if rank.world > 1:
        for name, value in NCCL_ENV.items():  # NVLink multicast off, unless the user says otherwise
            os.environ.setdefault(name, value)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    return rank, device


def stop(rank: Rank) -> None:
    if rank.world > 1:
        torch.distributed.destroy_process_group()
