"""Req and ScheduleBatch for one extend, with 0.5.14's request fields: the ids an array("q"),
`full_untruncated_fill_ids`, `fill_len` and `set_extend_input_len`; the batch carries the
one-shot `capture_hidden_mode`."""

from __future__ import annotations

import torch
from fake_core import _Req, _ScheduleBatch


class Req(_Req):
    def _release_fields(self) -> None:
        self.fill_len = 0
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.extend_input_len = 0
        self.return_hidden_states = False

    def set_extend_input_len(self, extend_input_len):
        self.extend_input_len = extend_input_len


class ScheduleBatch(_ScheduleBatch):
    def _release_fields(self) -> None:
        self.capture_hidden_mode = None
        self.return_hidden_states = any(r.return_hidden_states for r in self.reqs)

    def _extend_lens(self) -> list[int]:
        """As the scheduler's admission leaves them: fill_len over the fill ids, less the prefix."""
        for req in self.reqs:
            if req.fill_len != len(req.full_untruncated_fill_ids):
                raise ValueError(f"{req.rid}: fill_len {req.fill_len} is not the fill ids'")
            if req.extend_input_len != req.fill_len - len(req.prefix_indices):
                raise ValueError(f"{req.rid}: extend_input_len {req.extend_input_len}")
        return [r.extend_input_len for r in self.reqs]
