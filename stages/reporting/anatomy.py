"""A reply's ids cut into what a person reads apart: reasoning, answer, tool calls and the stop
token, by token role (never by parsing text), and each part decoded with its special tokens kept
and marked.

The cut follows `target.tokens.analyze_output` (the counts the quality questions use): the ids
before the first end-of-reasoning token are reasoning when the prompt opened it or the reply
writes the think token; a reply whose reasoning never closed is all reasoning. In the answer, a
tool-call section (or, without section tokens, each call block) is its own part, up to its end
token (to the end of the reply when it never closes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from ..target_model.tokens import TokenRoles

KINDS = ("reasoning", "answer", "tool_calls", "stop")


@dataclass(frozen=True)
class Part:
    kind: str  # one of KINDS
    ids: list[int]


def split_reply(ids: Sequence[int], roles: TokenRoles, reasoning_open: bool) -> list[Part]:
    """The reply's parts in order; their ids concatenate back to `ids`."""
    ids = list(ids)
    stop: list[int] = []
    if ids and ids[-1] in roles.stop_ids:
        ids, stop = ids[:-1], ids[-1:]
    parts: list[Part] = []
    opened = reasoning_open or (roles.think is not None and roles.think in ids)
    rest = ids
    if opened:
        if roles.end_think is not None and roles.end_think in ids:
            cut = ids.index(roles.end_think) + 1
            parts.append(Part("reasoning", ids[:cut]))
            rest = ids[cut:]
        else:
            parts.append(Part("reasoning", ids))
            rest = []
    parts += _answer_parts(rest, roles)
    if stop:
        parts.append(Part("stop", stop))
    return [p for p in parts if p.ids]


def _answer_parts(ids: list[int], roles: TokenRoles) -> list[Part]:
    begin: int | None = roles.tool_section_begin
    end: int | None = roles.tool_section_end
    if begin is None:
        begin, end = roles.tool_call_begin, roles.tool_call_end
    parts: list[Part] = []
    text: list[int] = []
    i = 0
    while i < len(ids):
        if begin is not None and ids[i] == begin:
            if text:
                parts.append(Part("answer", text))
                text = []
            j = ids.index(end, i) + 1 if end is not None and end in ids[i:] else len(ids)
            parts.append(Part("tool_calls", ids[i:j]))
            i = j
        else:
            text.append(ids[i])
            i += 1
    if text:
        parts.append(Part("answer", text))
    return parts


def decode_marked(
    ids: Sequence[int], decode: Callable[[list[int]], str], special: Collection[int]
) -> list[tuple[str, bool]]:
    """(text, is_special) pieces: runs of ordinary ids decoded together, each special id alone
    (as its token string), so a page can show where the template's and roles' tokens sit."""
    pieces: list[tuple[str, bool]] = []
    run: list[int] = []
    for t in ids:
        if t in special:
            if run:
                pieces.append((decode(run), False))
                run = []
            pieces.append((decode([t]), True))
        else:
            run.append(t)
    if run:
        pieces.append((decode(run), False))
    return pieces
