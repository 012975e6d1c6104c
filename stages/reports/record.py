"""A report as a frozen dataclass: `write` puts it in its JSON file and `read` takes it back.

The JSON is the record's fields as they are declared (nested records as objects, a mapping's
keys as text: a temperature 0.7 as "0.7"), NaN as null, written atomically (write_json). Reading
is strict: every field must be there, no other key may be, and every value must be of its
field's type, else ReportError names the file, the key and the stage to rerun. A write checks the
same before it writes, so no stage writes a report its readers refuse.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from ..runtime.files import write_json

R = TypeVar("R", bound="Report")
T = TypeVar("T")


class ReportError(ValueError):
    """A report file that does not hold its record: missing, not JSON, a key missing or unknown,
    a value of another type."""


class Mismatch(ValueError):
    """Where in a JSON value (`at`, e.g. `temperatures["0.7"].tau`) it leaves its type, and how."""

    def __init__(self, at: str, problem: str):
        super().__init__(f"{at}: {problem}" if at else problem)


class Report:
    """What every report record shares; each subclass is a frozen dataclass naming in STAGE the
    DVC stage that writes it, which a refused file's error says to rerun."""

    STAGE: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_json(cls: type[R], data: object) -> R:
        """The record `data` holds; Mismatch where it does not."""
        return decode(cls, data)

    def write(self, path: Path | str) -> None:
        """Write the report to `path`, checked first to read back as it is."""
        data = self.to_json()
        try:
            type(self).from_json(data)
        except Mismatch as err:
            raise ReportError(
                f"{path}: the {self.STAGE} stage built a report its readers would refuse "
                f"({err}); its record in stages/reports/ and the stage disagree"
            ) from None
        write_json(data, path)

    @classmethod
    def read(cls: type[R], path: Path | str) -> R:
        """The report at `path`, or ReportError naming the file, the key and what to rerun."""
        return checked(cls, path, cls.from_json)


def load(path: Path | str, stage: str) -> object:
    """The JSON of a report file, or ReportError saying which stage writes it."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(
            f"{path} does not exist; run the {stage} stage (dvc repro {stage})"
        ) from None
    except ValueError as err:
        raise ReportError(
            f"{path}: not JSON ({err}); rerun the {stage} stage (dvc repro {stage})"
        ) from None


def checked(cls: type[Report], path: Path | str, parse: Callable[[object], T]) -> T:
    """`parse` of the JSON at `path` (a record's from_json), a Mismatch raised as ReportError
    naming the file and the stage that writes it."""
    data = load(path, cls.STAGE)
    try:
        return parse(data)
    except Mismatch as err:
        raise ReportError(
            f"{path}: {err}; it is not what the {cls.STAGE} stage writes now (an older version "
            f"wrote it, or it was edited): rerun the stage (dvc repro {cls.STAGE})"
        ) from None


def encode(value: Any) -> Any:
    """The JSON value of a record, a mapping, a list or a scalar (NaN: None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):  # keys as text: a temperature 0.7 as "0.7"
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def decode(tp: Any, value: object, at: str = "") -> Any:
    """`value` (parsed JSON) as type `tp`: a record, dict, list, X | None, Literal or scalar."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        return _decode_union(get_args(tp), value, at)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _decode_record(tp, value, at)
    if origin in (dict, Mapping):
        key_type, value_type = get_args(tp)
        items = _expect(dict, value, at, "an object")
        return {
            _decode_key(key_type, k, at): decode(value_type, v, f'{at}["{k}"]')
            for k, v in items.items()
        }
    if origin is list:
        (item_type,) = get_args(tp)
        return [decode(item_type, v, f"{at}[{i}]") for i, v in enumerate(_expect(list, value, at))]
    if origin is Literal:
        if value not in get_args(tp):
            allowed = " or ".join(map(_shown, get_args(tp)))
            raise Mismatch(at, f"{_shown(value)} where {allowed} belongs")
        return value
    return _decode_scalar(tp, value, at)


def _decode_union(options: tuple, value: object, at: str) -> Any:
    if value is None and type(None) in options:
        return None
    problems = []
    for option in (o for o in options if o is not type(None)):
        try:
            return decode(option, value, at)
        except Mismatch as err:
            problems.append(err)
    if len(problems) == 1:
        raise problems[0]
    raise Mismatch(at, f"{_shown(value)} is none of {' | '.join(map(_name, options))}")


@functools.cache
def _fields(tp: type) -> dict[str, Any]:
    """A record's init fields and their types, in declaration order."""
    hints = get_type_hints(tp)
    return {f.name: hints[f.name] for f in dataclasses.fields(tp) if f.init}


def _decode_record(tp: type, value: object, at: str) -> Any:
    """Every field present and no other key: defaults fill nothing in, so a key renamed by its
    writer is refused, not read as its default."""
    data = _expect(dict, value, at, "an object")
    fields = _fields(tp)
    missing = [n for n in fields if n not in data]
    unknown = [k for k in data if k not in fields]
    if missing:
        close = difflib.get_close_matches(missing[0], unknown, n=1)
        instead = f' (the file has "{close[0]}" instead)' if close else ""
        raise Mismatch(at, f'key "{missing[0]}" is missing{instead}')
    if unknown:
        raise Mismatch(at, f'unknown key "{unknown[0]}" (the record has no such field)')
    return tp(**{n: decode(t, data[n], f"{at}.{n}" if at else n) for n, t in fields.items()})


def _decode_key(tp: Any, key: str, at: str) -> Any:
    if tp is str:
        return key
    try:
        return tp(key)
    except ValueError:
        raise Mismatch(at, f'key "{key}" is not a {_name(tp)}') from None


def _decode_scalar(tp: Any, value: object, at: str) -> Any:
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    if tp in (int, float, str, bool):
        raise Mismatch(at, f"{_shown(value)} where a {_name(tp)} belongs")
    raise TypeError(f"a report field of type {tp!r}, which stages/reports/record.py cannot read")


def _expect(kind: type, value: object, at: str, words: str = "a list") -> Any:
    if not isinstance(value, kind):
        raise Mismatch(at, f"{_shown(value)} where {words} belongs")
    return value


def _shown(value: object) -> str:
    return "null" if value is None else json.dumps(value, default=repr)[:60]


def _name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    return {int: "whole number", float: "number", str: "string", bool: "true/false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )
