"""The capture interface: token ids in, the target's EAGLE-3 features out, whatever runs the target.

`Capture` is the one seam between the extract stage and an engine. An engine takes a batch of
samples' input_ids and gives back, per sample and in the stored dtype, `aux` [T, num_aux * H]
(HF `hidden_states[i]` for each recorded index i, concatenated in index order) and `last` [T, H]
(the target's final post-norm state), plus the facts the artifact records. How it groups samples
into forwards, and where it runs, is its own business:

- `HFCapture` (here): a whole target per process, forward hooks (features.FeatureExtractor),
  samples packed into rows without padding (packing.py); under torchrun the processes split the
  shards between them.
- `SGLangCapture` (stages/engines/sglang_capture.py): SGLang's model runner, one tensor-parallel
  group over every torchrun rank; all ranks run every forward, rank 0 writes.

`Role` says which shards a process captures and whether it writes them; `ShardCapture` is the
engine-agnostic loop that puts shards' features into host buffers while the next forwards run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from .features import FeatureBuffers, FeatureExtractor, compile_layers
from .packing import PackedRow, packed_rows, use_packed_attention, warm_up_row

# (position of the sample in the batch given, aux [T, num_aux * H], last [T, H])
Captured = tuple[int, torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class Role:
    """This process's part: it captures every groups-th shard of those left to extract, from the
    group-th on, and writes them when `writes` (the processes of one tensor-parallel group all
    capture, one writes)."""

    group: int = 0
    groups: int = 1
    writes: bool = True


@runtime_checkable
class Capture(Protocol):
    """Token ids in, per sample aux [T, len(aux_indices) * H] and last [T, H] out."""

    @property
    def aux_indices(self) -> list[int]:
        """HF hidden_states indices captured, ascending (index i: the input of layer i)."""
        ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def architecture(self) -> str:
        """The target's architecture as its config.json names it."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """The stored dtype: the features come back in it."""
        ...

    @property
    def role(self) -> Role: ...

    def capture(self, input_ids: Sequence[Sequence[int]]) -> Iterator[Captured]:
        """(position, aux, last) for every sample of `input_ids`, each once, in any order. The
        tensors are copied out on another stream after they are given (ShardCapture), so no
        later forward may write into them: a fresh tensor per forward, as both engines give
        (the caching allocator keeps its memory until the copies are done)."""
        ...


def config_facts(path: str | Path) -> tuple[str, int, int]:
    """(architecture, num_hidden_layers, hidden_size) from a local checkpoint's config.json,
    without loading it; a multimodal wrapper's (Kimi-K2.5's) language model under text_config."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    try:
        arch = (cfg.get("architectures") or text.get("architectures"))[0]
        return str(arch), int(text["num_hidden_layers"]), int(text["hidden_size"])
    except (KeyError, TypeError, IndexError) as err:
        raise ValueError(
            f"{path}/config.json: no architectures / num_hidden_layers / hidden_size ({err})"
        ) from err


class HFCapture:
    """The `hf` engine: a whole target in this process, hooks on its decoder layers.

    Samples are packed in order into rows of at most `batch_tokens` tokens, each sample's
    positions from 0 and its attention within itself (packing.py), so no forward computes
    padding. With `compile`, each decoder layer is torch.compiled once for every row length
    (dynamic shapes); the first capture compiles it on a synthetic row before any real one
    (timed_rate's warm-up), so no sample waits for a compilation and no row length recompiles.
    """

    def __init__(
        self,
        model,
        aux_indices: list[int],
        dtype: torch.dtype,
        batch_tokens: int,
        role: Role = Role(),
        compile: bool = False,
    ):
        self.extractor = FeatureExtractor(model, aux_indices)
        use_packed_attention(model)
        if compile:
            compile_layers(model, dynamic=True)
        self._cold = compile
        self.model = model
        self.batch_tokens = batch_tokens
        self.device = next(model.parameters()).device
        # the Capture properties
        cfg = model.config
        self.aux_indices = self.extractor.aux_indices
        self.hidden_size = int(cfg.hidden_size)
        self.num_layers = int(cfg.num_hidden_layers)
        self.architecture = (cfg.architectures or [type(model).__name__])[0]
        self.dtype = dtype
        self.role = role

    def capture(self, input_ids: Sequence[Sequence[int]]) -> Iterator[Captured]:
        if self._cold:
            self._forward(warm_up_row(self.batch_tokens))
            self._cold = False
        for row_samples in packed_rows([len(s) for s in input_ids], self.batch_tokens):
            row = PackedRow.of([input_ids[p] for p in row_samples])
            aux, last = self._forward(row)
            for p, (start, end) in zip(row_samples, row.spans):
                yield p, aux[start:end], last[start:end]

    def _forward(self, row: PackedRow) -> tuple[torch.Tensor, torch.Tensor]:
        aux, last = self.extractor(**row.to(self.device).inputs())
        return aux[0].to(self.dtype), last[0].to(self.dtype)


def check_features(capture: Capture, n: int, aux: torch.Tensor, last: torch.Tensor) -> None:
    """The features of a sample of n tokens have the shapes and dtype the artifact holds."""
    want_aux = (n, len(capture.aux_indices) * capture.hidden_size)
    want_last = (n, capture.hidden_size)
    if tuple(aux.shape) != want_aux or tuple(last.shape) != want_last:
        raise ValueError(
            f"capture gave aux {tuple(aux.shape)} and last {tuple(last.shape)} for a sample of "
            f"{n} tokens; expected {want_aux} and {want_last}"
        )
    if aux.dtype != capture.dtype or last.dtype != capture.dtype:
        raise ValueError(f"capture gave {aux.dtype}/{last.dtype}, not the stored {capture.dtype}")


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
