"""The capture interface: token ids in, the target's EAGLE-3 features out, whatever runs the target.

`Capture` is the one seam between the extract stage and an engine. An engine takes a batch of
samples' input_ids and gives back, per sample and in the stored dtype, `aux` [T, num_aux * H]
(HF `hidden_states[i]` for each recorded index i, concatenated in index order) and `last` [T, H]
(the target's final post-norm state), plus the facts the artifact records. How it groups samples
into forwards, and where it runs, is its own business:

- `HFCapture` (here): a whole target per process, forward hooks (features.FeatureExtractor),
  padded batches by length; under torchrun the processes split the shards between them.
- `SGLangCapture` (stages/engines/sglang_capture.py): SGLang's model runner, one tensor-parallel
  group over every torchrun rank; all ranks run every forward, rank 0 writes.

`Role` says which shards a process captures and whether it writes them; `capture_shard` is the
engine-agnostic loop that puts a shard's features into host buffers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from .features import FeatureBuffers, FeatureExtractor, length_batches

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
        tensors may be views of the engine's own buffers: copy them before the next one."""
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

    Samples are grouped by length into padded batches of at most `batch_tokens` (sorted, so
    padding stays small), exactly as the extract stage always batched them: the features are
    bitwise those of `features.capture_shard`.
    """

    def __init__(
        self,
        model,
        aux_indices: list[int],
        dtype: torch.dtype,
        batch_tokens: int,
        role: Role = Role(),
    ):
        self.extractor = FeatureExtractor(model, aux_indices)
        self.model = model
        self.batch_tokens = batch_tokens
        self._dtype = dtype
        self._role = role
        cfg = model.config
        self._arch = (cfg.architectures or [type(model).__name__])[0]
        self.device = next(model.parameters()).device

    @property
    def aux_indices(self) -> list[int]:
        return self.extractor.aux_indices

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def architecture(self) -> str:
        return self._arch

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def role(self) -> Role:
        return self._role

    def capture(self, input_ids: Sequence[Sequence[int]]) -> Iterator[Captured]:
        rows = [{"pos": i, "input_ids": ids} for i, ids in enumerate(input_ids)]
        for batch in length_batches(rows, self.batch_tokens):
            width = max(len(r["input_ids"]) for r in batch)
            ids = torch.zeros((len(batch), width), dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for b, r in enumerate(batch):
                ids[b, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
                mask[b, : len(r["input_ids"])] = 1
            aux, last = self.extractor(ids.to(self.device), mask.to(self.device))
            aux, last = aux.to(self._dtype), last.to(self._dtype)
            for b, r in enumerate(batch):
                n = len(r["input_ids"])
                yield r["pos"], aux[b, :n], last[b, :n]


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


def capture_shard(
    capture: Capture, rows: list[dict], buffers: FeatureBuffers | None
) -> dict[str, torch.Tensor]:
    """Features of `rows` (dicts with input_ids) in order: aux and last in the next set of
    `buffers`, and input_ids. With no buffers (a process that does not write) the forwards run
    and nothing is kept."""
    lengths = [len(r["input_ids"]) for r in rows]
    starts = torch.tensor([0] + lengths).cumsum(0).tolist()
    out = buffers.take(sum(lengths)) if buffers is not None else None
    devices = set()
    seen = 0
    for pos, aux, last in capture.capture([r["input_ids"] for r in rows]):
        check_features(capture, lengths[pos], aux, last)
        seen += 1
        if out is not None:
            start, n = starts[pos], lengths[pos]
            out[0][start : start + n].copy_(aux, non_blocking=True)
            out[1][start : start + n].copy_(last, non_blocking=True)
            devices.add(aux.device)
    if seen != len(rows):
        raise ValueError(f"capture gave features for {seen} of {len(rows)} samples")
    for device in devices:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the copies have landed
    input_ids = torch.cat([torch.tensor(r["input_ids"], dtype=torch.int32) for r in rows])
    if out is None:
        return {"input_ids": input_ids}
    return {"aux": out[0], "last": out[1], "input_ids": input_ids}


def timed_rate(
    capture: Capture,
    input_ids: Sequence[Sequence[int]],
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Tokens/s of one capture of `input_ids`, after an untimed warm-up on the first sample (CUDA
    start-up, kernel compilation): what the projection before a run is based on."""
    if not input_ids:
        return 0.0
    _drain(capture.capture(input_ids[:1]))
    start = clock()
    _drain(capture.capture(input_ids))
    return sum(map(len, input_ids)) / max(clock() - start, 1e-9)


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
