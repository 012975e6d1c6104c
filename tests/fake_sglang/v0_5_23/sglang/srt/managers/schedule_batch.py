"""Req and ScheduleBatch for one extend, with 0.5.23's request fields: the ids an array("q"),
`full_untruncated_fill_ids`, `extend_end` and `prefix_len`."""

from __future__ import annotations

from fake_core import _Req, _ScheduleBatch


class Req(_Req):
    def _release_fields(self) -> None:
        self.extend_end = None
        self.prefix_len = 0


class ScheduleBatch(_ScheduleBatch):
    def _extend_lens(self) -> list[int]:
        """From each request's prefix to its `extend_end`."""
        for req in self.reqs:
            if req.extend_end is None or req.extend_end > len(req.full_untruncated_fill_ids):
                raise ValueError(f"{req.rid}: extend_end {req.extend_end}")
        return [r.extend_end - r.prefix_len for r in self.reqs]
