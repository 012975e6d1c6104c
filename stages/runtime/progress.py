"""Progress lines for long work: items and tokens done, rate and ETA."""

from __future__ import annotations

import sys
import time


class Progress:
    """Items and tokens done, tokens/s and ETA against a token or item budget, on stderr.

    Plain text lines (not a live bar) so the output stays readable in `dvc repro` logs and CI.
    """

    def __init__(
        self,
        label: str,
        total_items: int,
        token_budget: int | None = None,
        every_s: float = 2.0,
        stream=None,
    ):
        self.label, self.total_items, self.token_budget = label, total_items, token_budget
        self.items = self.tokens = 0
        self.every_s, self.stream = every_s, stream or sys.stderr  # stderr as it is now
        self.start = self.last = time.monotonic()

    def update(self, items: int, tokens: int) -> None:
        self.items += items
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= self.every_s or self.items >= self.total_items:
            self.last = now
            print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.tokens / elapsed
        item_left = (self.total_items - self.items) / max(self.items / elapsed, 1e-9)
        eta = item_left
        if self.token_budget:
            eta = min(eta, max(self.token_budget - self.tokens, 0) / max(rate, 1e-9))
        budget = f"/{self.token_budget:,}" if self.token_budget else ""
        return (
            f"[{self.label}] {self.items}/{self.total_items} samples  "
            f"{self.tokens:,}{budget} tokens  {rate:,.0f} tok/s  "
            f"elapsed {hms(elapsed)}  eta {hms(eta) if self.items else '?'}"
        )


def hms(seconds: float) -> str:
    """h:mm:ss"""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
