"""The shard loop of extraction, whatever the engine: shards' features into host buffers while
the next forwards run (`ShardCapture`), and the timing of one batch the projection uses."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from .buffers import FeatureBuffers
from .interface import Capture, Captured, check_features


@dataclass
class CaptureTimes:
    """Where extraction's time went, in seconds: the device's forwards and its copies out (CUDA
    events; wall clock on the CPU), and the host waiting for the copies to land and for host
    buffers still being allocated."""

    forward_s: float = 0.0
    copy_s: float = 0.0
    landed_wait_s: float = 0.0
    buffers_wait_s: float = 0.0


@dataclass
class _Queued:
    """A shard whose forwards and copies are queued: its features, and the CUDA events that
    tell when they are done (empty on the CPU, where they already are)."""

    k: int
    rows: list[dict]
    tensors: dict[str, torch.Tensor]
    forward: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    copies: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)


class ShardCapture:
    """Shards' features into host buffers, pipelined so that the device does not wait for the
    host: the copies out of the device run on a stream of their own, overlapping the next
    forwards, and a shard is handed on once its copies have landed, which is after the next
    shard's forwards have been queued. `buffers` needs two sets besides those the caller still
    holds (one filling, one landing); with none (a process that does not write) the forwards
    run and nothing is kept; with no capture (nothing stored) a shard is its input_ids."""

    def __init__(
        self, capture: Capture | None, buffers: FeatureBuffers | None, device: torch.device
    ):
        self.capture = capture
        self.buffers = buffers
        self.cuda = device.type == "cuda" and capture is not None
        self.stream = torch.cuda.Stream(device) if self.cuda else None  # the copies'
        self.device = device
        self.times = CaptureTimes()

    def shards(
        self, shards: Iterable[tuple[int, list[dict]]]
    ) -> Iterator[tuple[int, list[dict], dict[str, torch.Tensor]]]:
        """(k, rows, features) for each (k, rows) of `shards`, in order: aux and last (in a set
        of `buffers`) and input_ids, of rows (dicts with input_ids) in order."""
        pending: _Queued | None = None
        for k, rows in shards:
            queued = self.capture_shard(k, rows)
            if pending is not None:
                yield self._landed(pending)
            pending = queued
        if pending is not None:
            yield self._landed(pending)

    def capture_shard(self, k: int, rows: list[dict]) -> _Queued:
        """Queue the forwards of shard k's rows and the copies of their features."""
        lengths = [len(r["input_ids"]) for r in rows]
        starts = torch.tensor([0] + lengths).cumsum(0).tolist()
        clock = time.perf_counter()
        out = self.buffers.take(sum(lengths)) if self.buffers is not None else None
        self.times.buffers_wait_s += time.perf_counter() - clock
        input_ids = torch.cat([torch.tensor(r["input_ids"], dtype=torch.int32) for r in rows])
        queued = _Queued(k, rows, {"input_ids": input_ids})
        if out is not None:
            queued.tensors.update(aux=out[0], last=out[1])
        if self.capture is None:
            return queued
        start = self._event(torch.cuda.current_stream(self.device)) if self.cuda else None
        clock, copied = time.perf_counter(), self.times.copy_s
        seen = 0
        for pos, aux, last in self.capture.capture([r["input_ids"] for r in rows]):
            check_features(self.capture, lengths[pos], aux, last)
            seen += 1
            if out is not None:
                at = slice(starts[pos], starts[pos] + lengths[pos])
                copies = self._copy(((out[0][at], aux), (out[1][at], last)))
                queued.copies += [copies] if copies else []
        if seen != len(rows):
            raise ValueError(f"capture gave features for {seen} of {len(rows)} samples")
        if start is not None:
            queued.forward = (start, self._event(torch.cuda.current_stream(self.device)))
        else:  # the CPU ran the forwards and the copies in turn
            self.times.forward_s += time.perf_counter() - clock - (self.times.copy_s - copied)
        return queued

    @staticmethod
    def _event(stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def _copy(self, pairs) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """Copy (host, device) pairs; on a GPU queued on the copy stream after the forward that
        made them, between two events."""
        if self.stream is None:
            clock = time.perf_counter()
            for dst, src in pairs:
                dst.copy_(src)
            self.times.copy_s += time.perf_counter() - clock
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        start = self._event(self.stream)
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.stream)  # its memory stays until the copy is done
        return start, self._event(self.stream)

    def _landed(self, queued: _Queued) -> tuple[int, list[dict], dict[str, torch.Tensor]]:
        """Wait for a queued shard's copies (its forwards without copies) and count the device
        time they took."""
        clock = time.perf_counter()
        if queued.forward is not None:
            for _, done in [queued.forward, *queued.copies[-1:]]:
                done.synchronize()
            self.times.forward_s += queued.forward[0].elapsed_time(queued.forward[1]) / 1e3
            self.times.copy_s += sum(a.elapsed_time(b) for a, b in queued.copies) / 1e3
        self.times.landed_wait_s += time.perf_counter() - clock
        return queued.k, queued.rows, queued.tensors


def timed_rate(
    capture: Capture,
    input_ids: Sequence[Sequence[int]],
    clock: Callable[[], float] = time.monotonic,
) -> tuple[float, float]:
    """(seconds of a warm-up on the first sample: CUDA start-up, kernel compilation; tokens/s of
    one capture of `input_ids` after it): the warm-up a run reports apart, and the rate the
    projection before it is based on."""
    if not input_ids:
        return 0.0, 0.0
    start = clock()
    _drain(capture.capture(input_ids[:1]))
    warm = clock()
    _drain(capture.capture(input_ids))
    return warm - start, sum(map(len, input_ids)) / max(clock() - warm, 1e-9)


def _drain(captured: Iterator[Captured]) -> None:
    """Run the forwards and wait for the device to finish them."""
    devices = {aux.device for _, aux, _ in captured}
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def leading_rows(rows: list[dict], tokens: int) -> list[dict]:
    """The first rows whose lengths add up to at most `tokens` (at least one)."""
    picked: list[dict] = []
    total = 0
    for r in rows:
        if picked and total + len(r["input_ids"]) > tokens:
            break
        picked.append(r)
        total += len(r["input_ids"])
    return picked
