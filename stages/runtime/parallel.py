"""Process groups under torchrun (extract, train): one place that reads the torchrun environment,
applies the NCCL settings the project needs, and picks each rank's GPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# NVLink multicast (NVLS) hangs or fails on shared and partitioned GPU hosts; collectives work
# without it at a small cost. Also applied to the SGLang servers the pipeline launches.
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@dataclass
class Rank:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


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
