"""Source adapters: public dataset files -> canonical conversations (OpenAI-style messages + tools).

    for conversation in read_conversations("data.jsonl", "sharegpt"):
        prompt = prompt_messages(conversation.messages)     # to rewrite the last turn
        bounds = turn_bounds(conversation.messages)         # to rewrite every turn

Each format is an adapter: given the `columns` mapping (only format "columns" takes one) it returns
the function that turns one row into a Conversation. Adding a format is one entry in FORMATS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from . import benchmarks, code_instruct, glaive, openai_messages, sharegpt
from .columns import ColumnMapping
from .conversation import Conversation, prompt_messages, turn_bounds
from .rows import RowError, SourceError, read_rows

RowParser = Callable[[Mapping], Conversation]
Adapter = Callable[[Mapping[str, str] | None], RowParser]

__all__ = [
    "Conversation",
    "FORMATS",
    "SourceError",
    "prompt_messages",
    "read_conversations",
    "turn_bounds",
]


def _fixed(parse: RowParser) -> Adapter:
    """The adapter of a format with a fixed schema, which takes no column mapping."""

    def adapter(columns: Mapping[str, str] | None) -> RowParser:
        if columns is not None:
            raise ValueError(
                "this format has a fixed schema; a column mapping needs format 'columns'"
            )
        return parse

    return adapter


FORMATS: dict[str, Adapter] = {
    "sharegpt": _fixed(sharegpt.parse_row),
    "openai_messages": _fixed(openai_messages.parse_row),
    "glaive": _fixed(sharegpt.parse_row),  # LLaMA-Factory's conversion is ShareGPT with tools
    "glaive_raw": _fixed(glaive.parse_row),
    "opencodeinstruct": _fixed(code_instruct.OPENCODEINSTRUCT),
    "magicoder_oss": _fixed(code_instruct.MAGICODER_OSS),
    "magicoder_evol": _fixed(code_instruct.MAGICODER_EVOL),
    "gsm8k": _fixed(benchmarks.GSM8K),
    "mt_bench": _fixed(benchmarks.mt_bench),
    "humaneval": _fixed(benchmarks.HUMANEVAL),
    "columns": ColumnMapping.from_dict,
}


def read_conversations(
    path: str | Path,
    format: str,
    *,
    columns: Mapping[str, str] | None = None,
    on_bad_row: Callable[[SourceError], None] | None = None,
) -> Iterator[Conversation]:
    """The file's conversations, in file order.

    An unknown format, a bad column mapping, or a missing or unreadable file raises SourceError at
    once. A malformed row (bad JSON line, missing field, wrong type, empty conversation, unknown
    role) raises SourceError, or, when `on_bad_row` is given, is passed to it and skipped.
    """
    if format not in FORMATS:
        raise SourceError(
            path, None, f"unknown format {format!r}; known formats: {', '.join(FORMATS)}"
        )
    try:
        parse = FORMATS[format](columns)
    except ValueError as err:
        raise SourceError(path, None, f"format {format!r}: {err}") from None
    return _conversations(read_rows(path, on_bad_row), parse, path, on_bad_row)


def _conversations(
    rows, parse: RowParser, path: str | Path, on_bad_row: Callable[[SourceError], None] | None
) -> Iterator[Conversation]:
    for row in rows:
        try:
            yield parse(row.record)
        except RowError as err:
            error = SourceError(path, row.number, str(err), row.unit)
            if on_bad_row is None:
                raise error from None
            on_bad_row(error)
