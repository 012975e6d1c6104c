"""ServerArgs: a dataclass whose __post_init__ resolves the defaults (as 0.5.14's does)."""

from __future__ import annotations

from dataclasses import dataclass

from fake_core import _ServerArgs


@dataclass(kw_only=True)
class ServerArgs(_ServerArgs):
    device: str | None = None

    def __post_init__(self) -> None:
        self.page_size = self.page_size or 1
        self.device = self.device or "cpu"
        self.mem_fraction_static = self.mem_fraction_static or 0.88
        self._record()
