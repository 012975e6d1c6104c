"""ForwardBatch.init_new(batch, model_runner, capture_hidden_mode=..., *,
return_hidden_states_before_norm): the ScheduleBatch itself, the capture mode given."""

from __future__ import annotations

import torch
from fake_core import CaptureHiddenMode


class ForwardBatch:
    @classmethod
    def init_new(
        cls, batch, model_runner, *, capture_hidden_mode=None, return_hidden_states_before_norm
    ) -> ForwardBatch:
        self = cls.__new__(cls)
        self.input_ids = batch.input_ids
        self.extend_seq_lens_cpu = list(batch.extend_lens)
        self.batch_size = len(batch.reqs)
        self.positions = torch.cat([torch.arange(n) for n in self.extend_seq_lens_cpu])
        self.capture_hidden_mode = capture_hidden_mode or CaptureHiddenMode.NULL
        return self
