"""Rows out of JSON, JSON Lines (both optionally gzipped) and Parquet files, with 1-based numbers.

Every adapter reads its file through here, so a bad row is always reported the same way: the file,
the row (the line of a JSON Lines file, the element of a JSON list, the row of a Parquet file) and
what is wrong with it.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", ".parquet")
_CHUNK_CHARS = 1 << 20
_PARQUET_BATCH_ROWS = 1024
_NON_SPACE = re.compile(r"\S")


class SourceError(ValueError):
    """A dataset file, or one of its rows, that cannot be read; str() says where and why."""

    def __init__(self, path: str | Path, row: int | None, reason: str, unit: str = "row"):
        super().__init__(str(path), row, reason, unit)  # all four, so the error pickles
        self.path, self.row, self.reason, self.unit = str(path), row, reason, unit

    def __str__(self) -> str:
        where = self.path if self.row is None else f"{self.path}, {self.unit} {self.row}"
        return f"{where}: {self.reason}"


class RowError(ValueError):
    """One row that cannot become a conversation; the reader adds the file and row number."""


@dataclass(frozen=True)
class Row:
    number: int  # 1-based: the line of a JSON Lines file, else the row's index + 1
    unit: str  # "line" or "row", for messages
    record: Any  # the row as read (any JSON value); read_rows yields only objects (dicts)


def read_rows(
    path: str | Path, on_bad_row: Callable[[SourceError], None] | None = None
) -> Iterator[Row]:
    """The file's rows, streamed where the format allows (JSON Lines, Parquet, JSON lists).

    A missing file or an unknown suffix fails here, before iteration. A JSON Lines line that is not
    a JSON object, or a row that is not an object, raises SourceError, or goes to `on_bad_row` and
    is skipped. A syntax error inside a JSON list always raises: the rest of the list cannot be
    found after it. A .json file whose first character is '{' is read as JSON Lines, as Hugging
    Face `datasets` writes them.
    """
    path = Path(path)
    if not path.is_file():
        raise SourceError(path, None, "no such file; check the dataset path")
    name = path.name.lower()
    rows: Iterator[Row | SourceError]
    if name.endswith(".parquet"):
        rows = _parquet_rows(path)
    elif name.endswith((".json", ".json.gz")) and _first_char(path) == "[":
        rows = _json_list_rows(path)
    elif name.endswith((".json", ".json.gz", ".jsonl", ".jsonl.gz")):
        rows = _json_lines_rows(path)
    else:
        raise SourceError(path, None, f"unknown file type; use one of {', '.join(SUFFIXES)}")
    return _objects_only(path, rows, on_bad_row)


def _objects_only(
    path: Path, rows: Iterator[Row | SourceError], on_bad_row: Callable[[SourceError], None] | None
) -> Iterator[Row]:
    for row in rows:
        if isinstance(row, Row) and not isinstance(row.record, Mapping):
            row = SourceError(
                path,
                row.number,
                f"is {json_type(row.record)}, expected an object with the dataset's fields",
                row.unit,
            )
        if isinstance(row, SourceError):
            if on_bad_row is None:
                raise row
            on_bad_row(row)
        else:
            yield row


def _open_binary(path: Path) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")


def _open_text(path: Path) -> TextIO:
    return (
        gzip.open(path, "rt", encoding="utf-8-sig")
        if path.name.lower().endswith(".gz")
        else open(path, encoding="utf-8-sig")
    )


def _first_char(path: Path) -> str:
    try:
        with _open_text(path) as stream:
            while chunk := stream.read(4096):
                if found := _NON_SPACE.search(chunk):
                    return found.group()
    except (OSError, EOFError, UnicodeDecodeError) as err:  # a broken .gz, or not UTF-8
        raise SourceError(path, None, f"cannot read the file ({err})") from None
    return ""


def _json_lines_rows(path: Path) -> Iterator[Row | SourceError]:
    number = 0
    try:
        with _open_binary(path) as stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    yield Row(number, "line", json.loads(line))
                except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
                    yield SourceError(
                        path,
                        number,
                        f"not valid JSON ({err}); each line must hold one JSON object",
                        "line",
                    )
    except (OSError, EOFError) as err:  # a broken or truncated .gz
        raise SourceError(path, number + 1, f"cannot read the file ({err})", "line") from None


def _json_list_rows(path: Path) -> Iterator[Row]:
    with _open_text(path) as stream:
        reader = _JsonListReader(stream)
        try:
            for index, record in enumerate(reader):
                yield Row(index + 1, "row", record)
        except ValueError as err:
            raise SourceError(
                path,
                reader.count + 1,
                f"not valid JSON ({err}); a .json file must "
                "hold one JSON list of objects, or one object per line",
            ) from None


class _JsonListReader:
    """The elements of a top-level JSON list, decoded one at a time from a text stream.

    Only the element being decoded is held in memory, so a list of millions of conversations
    streams like JSON Lines does.
    """

    def __init__(self, stream: TextIO):
        self.stream, self.text, self.pos, self.eof = stream, "", 0, False
        self.decoder = json.JSONDecoder()
        self.count = 0

    def __iter__(self) -> Iterator[Any]:
        if self._next_char() != "[":
            raise ValueError("expected '[' at the start")
        self.pos += 1
        while (char := self._next_char()) != "]":
            if self.count:
                if char != ",":
                    raise ValueError(
                        f"expected ',' or ']' after element {self.count}, "
                        f"found {char or 'the end of the file'!r}"
                    )
                self.pos += 1
                self._next_char()
            yield self._element()
            self.count += 1
        self.pos += 1
        if self._next_char():
            raise ValueError("unexpected text after the closing ']'")

    def _next_char(self) -> str:
        """Move to the next non-space character and return it ('' at the end of the file)."""
        while not (found := _NON_SPACE.search(self.text, self.pos)):
            self.pos = len(self.text)
            if self.eof:
                return ""
            self._read_more()
        self.pos = found.start()
        return found.group()

    def _element(self) -> Any:
        while True:
            try:
                value, end = self.decoder.raw_decode(self.text, self.pos)
                if end < len(self.text) or self.eof:  # else a number might continue in the file
                    self.pos = end
                    return value
            except json.JSONDecodeError as err:
                if self.eof:
                    raise ValueError(err.msg) from None
            self._read_more()

    def _read_more(self) -> None:
        """Drop the decoded text and append at least as much again: an element of any size fits."""
        chunk = self.stream.read(max(_CHUNK_CHARS, len(self.text) - self.pos))
        self.text, self.pos, self.eof = self.text[self.pos :] + chunk, 0, not chunk


def _parquet_rows(path: Path) -> Iterator[Row]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise SourceError(path, None, f"not a readable Parquet file ({err})") from None
    number = 0
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        for record in batch.to_pylist():
            number += 1
            yield Row(number, "row", record)


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages ('a string', 'null', ...)."""
    for kind, name in _JSON_TYPES.items():
        if isinstance(value, kind):
            return name
    return type(value).__name__


_JSON_TYPES = {
    type(None): "null",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    str: "a string",
    Mapping: "an object",
    list: "a list",
    tuple: "a list",
}


def require(record: Mapping, name: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    """record[name], checked to be of `kind`. The RowError names the field and what it holds, or
    the fields the record does have when it is missing."""
    prefix = f"{where}: " if where else ""
    if name not in record:
        present = ", ".join(map(str, record)) or "none"
        raise RowError(f"{prefix}missing field {name!r} (fields present: {present})")
    value = record[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(dict.fromkeys(_JSON_TYPES.get(k, k.__name__) for k in kinds))
        raise RowError(f"{prefix}field {name!r} is {json_type(value)}, expected {expected}")
    return value
