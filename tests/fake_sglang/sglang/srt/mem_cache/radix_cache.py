"""Stand-in for sglang.srt.mem_cache.radix_cache: a tree that, disabled, matches nothing.

Enabled, it remembers every sequence it was given (as a server's persistent tree does) and
matches their prefixes: the batch then only extends past them, and their states are missing."""

from __future__ import annotations

from sglang._fake import record

SEEN: list[tuple[int, ...]] = []


class RadixCache:
    def __init__(self, params):
        self.disable = params.disable
        record("radix_cache", disable=params.disable)

    def match_prefix(self, ids: list[int]) -> int:
        if self.disable:
            return 0
        best = max((_common(ids, s) for s in SEEN), default=0)
        SEEN.append(tuple(ids))
        return min(best, len(ids) - 1)


def _common(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
