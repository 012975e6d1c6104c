"""Process groups under torchrun (extract, train): one place that reads the torchrun environment,
applies the NCCL settings the project needs, bounds how long a rank waits for the others, and
picks each rank's GPU."""

from __future__ import annotations

import contextlib
import errno
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import torch

# NVLink multicast (NVLS) hangs or fails on shared and partitioned GPU hosts; collectives work
# without it at a small cost. Also applied to the SGLang servers the pipeline launches.
NCCL_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# How long a rank waits in a collective (barrier, all-reduce) for the others before it fails, gloo
# and NCCL alike. Above the longest wait a healthy run has (rank 0 writing a checkpoint while the
# others wait in the next step's all-reduce; the slowest rank's last shard), small against a
# multi-day run. A rank that dies is noticed sooner: its peers' connections close, and torchrun
# stops the other ranks within its monitor interval (0.1 s); this bounds a rank that hangs, or one
# on another node. (torch's own defaults: 30 min for gloo, 10 for NCCL.)
TIMEOUT_ENV = "EAGLE_COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0


class CollectiveFailed(OSError):
    """A collective failed because another rank died or gave no answer within the timeout; the
    stage ends with this one line (an OSError the entry point prints), not a traceback of gloo's
    or NCCL's internals."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ECONNABORTED, message)


@dataclass
class Rank:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def start(device: torch.device) -> tuple[Rank, torch.device]:
    """(this process's rank, its device); a no-op outside torchrun. Under torchrun the process
    group is started whatever the world size: SGLang's model runner, finding none, starts its own
    over tcp://, which under torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE) connects as a
    client to a store nobody serves and waits until it times out."""
    rank = Rank(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))
    if rank.world > 1 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        for name, value in NCCL_ENV.items():  # NVLink multicast off, unless the user says otherwise
            os.environ.setdefault(name, value)
        torch.distributed.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s())
        )
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
    return rank, device


def stop() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def timeout_s() -> float:
    """The collective timeout in seconds: $EAGLE_COLLECTIVE_TIMEOUT_S, else DEFAULT_TIMEOUT_S."""
    value = os.environ.get(TIMEOUT_ENV, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    with contextlib.suppress(ValueError):
        if math.isfinite(seconds := float(value)) and seconds > 0:
            return seconds
    raise ValueError(
        f"{TIMEOUT_ENV}={value!r}: expected seconds above 0 (how long a rank waits for the "
        f"others in a collective); unset it for the default {DEFAULT_TIMEOUT_S:g}"
    )


@contextlib.contextmanager
def collective_failures_named(rank: Rank) -> Iterator[None]:
    """Under torchrun, a collective that fails (another rank died: its connections closed; or it
    hung past the timeout) raises CollectiveFailed naming this rank, what gloo or NCCL said, and
    the setting; any other error passes unchanged."""
    try:
        yield
    except RuntimeError as err:
        # NCCL and the store raise DistError; gloo a RuntimeError from its transport
        if rank.world == 1 or not (
            isinstance(err, torch.distributed.DistError) or "gloo/transport" in str(err)
        ):
            raise
        said = re.sub(r"^\[[^\]]*\]\s*", "", str(err).splitlines()[0]).split(". ")[0]
        raise CollectiveFailed(
            f"rank {rank.rank} of {rank.world}: a collective failed ({said}): another rank died "
            f"(torchrun's failure summary names it) or gave no answer within {timeout_s():g} s "
            f"({TIMEOUT_ENV}); what was finished is kept, rerun the stage to resume"
        ) from err
