"""The capture interface: token ids in, the target's EAGLE-3 features out, whatever runs the target.

`Capture` is the one seam between the extract stage (and the canary) and an engine. An engine
takes a batch of samples' input_ids and gives back, per sample and in the stored dtype, `aux`
[T, num_aux * H] (HF `hidden_states[i]` for each recorded index i, concatenated in index order)
and `last` [T, H] (the target's final post-norm state), plus the facts the artifact records. How
it groups samples into forwards, and where it runs, is its own business:

- `HFCapture` (hf.py): a whole target per process, forward hooks (hooks.py), samples packed into
  rows without padding (packing.py); under torchrun the processes split the shards between them.
- `SGLangCapture` (sglang.py): SGLang's model runner, one tensor-parallel group over every
  torchrun rank; all ranks run every forward, rank 0 writes.

`Role` says which shards a process captures and whether it writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

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
