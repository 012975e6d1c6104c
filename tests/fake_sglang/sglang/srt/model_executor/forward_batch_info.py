"""Stand-in for sglang.srt.model_executor.forward_batch_info: CaptureHiddenMode, ForwardBatch."""

from __future__ import annotations

from enum import IntEnum, auto

import torch


class CaptureHiddenMode(IntEnum):
    NULL = auto()
    LAST = auto()
    FULL = auto()

    def need_capture(self) -> bool:
        return self != CaptureHiddenMode.NULL

    def is_full(self) -> bool:
        return self == CaptureHiddenMode.FULL

    def is_last(self) -> bool:
        return self == CaptureHiddenMode.LAST


class ForwardBatch:
    def __init__(self, input_ids, extend_seq_lens_cpu, capture_hidden_mode):
        self.input_ids = input_ids
        self.extend_seq_lens_cpu = list(extend_seq_lens_cpu)
        self.capture_hidden_mode = capture_hidden_mode
        self.positions = torch.cat([torch.arange(n) for n in self.extend_seq_lens_cpu])

    @classmethod
    def init_new(cls, batch, model_runner) -> ForwardBatch:
        return cls(batch.input_ids, batch.extend_seq_lens, batch.capture_hidden_mode)
