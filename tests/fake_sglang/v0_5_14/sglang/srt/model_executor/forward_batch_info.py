"""ForwardBatch.init_new(batch, model_runner): the capture mode is the ScheduleBatch's one-shot
`capture_hidden_mode`, else FULL when a request asked for hidden states, else NULL."""

from __future__ import annotations

import torch
from fake_core import CaptureHiddenMode


class ForwardBatch:
    @classmethod
    def init_new(cls, batch, model_runner) -> ForwardBatch:
        self = cls.__new__(cls)
        self.input_ids = batch.input_ids
        self.extend_seq_lens_cpu = list(batch.extend_lens)
        self.batch_size = len(batch.reqs)
        self.positions = torch.cat([torch.arange(n) for n in self.extend_seq_lens_cpu])
        mode = batch.capture_hidden_mode
        batch.capture_hidden_mode = None
        if mode is None:
            mode = CaptureHiddenMode.FULL if batch.return_hidden_states else CaptureHiddenMode.NULL
        self.capture_hidden_mode = mode
        return self
