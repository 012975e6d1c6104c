"""The `hf` capture engine: a whole target in this process, hooks on its decoder layers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from .hooks import FeatureExtractor, compile_layers
from .interface import Captured, Role
from .packing import PackedRow, packed_rows, use_packed_attention, warm_up_row


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
