"""Host buffers a shard's features are copied into straight from the device."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch


class FeatureBuffers:
    """Host memory a shard's features are copied into straight from the device, in `sets` taken
    in turn: one fills while the others wait for their copies to land or are being written, and a
    set is filled again `sets` shards later, when the caller must be done with it (ShardWriter's
    order of waiting makes it so). Pinned on a GPU host, where a copy into pageable memory is
    many times slower than one into pinned memory (docs/performance.md).

    The sets are allocated on a thread of their own, in the order they are taken, so the caller
    can warm up beside them instead of waiting for the pinning before the first forward."""

    def __init__(
        self, tokens: int, aux_width: int, hidden: int, dtype: torch.dtype, pin: bool, sets: int
    ):
        def allocate() -> tuple[tuple[torch.Tensor, torch.Tensor], float]:
            start = time.perf_counter()
            aux, last = (
                torch.empty((tokens, width), dtype=dtype, pin_memory=pin)
                for width in (aux_width, hidden)
            )
            return (aux, last), time.perf_counter() - start

        pool = ThreadPoolExecutor(1, thread_name_prefix="feature-buffers")
        self.sets = [pool.submit(allocate) for _ in range(sets)]
        pool.shutdown(wait=False)  # the allocations queued still run
        self.turn = 0

    def take(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [tokens, aux_width], last [tokens, hidden]) views of the next set, once it is
        allocated."""
        (aux, last), _ = self.sets[self.turn].result()
        self.turn = (self.turn + 1) % len(self.sets)
        return aux[:tokens], last[:tokens]

    def allocation_s(self) -> float:
        """Seconds the allocations took on their thread (waiting for any still running)."""
        return sum(future.result()[1] for future in self.sets)
