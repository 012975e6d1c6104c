"""A report as a frozen dataclass: `write` puts it in its JSON file and `read` takes it back.

The JSON is the record's fields as they are declared (nested records as objects, a mapping's
keys as text: a temperature 0.7 as "0.7"), NaN as null, written atomically (write_json). Reading
is strict: every field must be there, no other key may be, and every value must be of its
field's type (checked as params.yaml's are, stages/runtime/typed.py), else ReportError names the
file, the key and the stage to rerun. A write checks the same before it writes, so no stage
writes a report its readers refuse.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from ..runtime.files import write_json
from ..runtime.typed import Typed, field_at, record_fields

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


class _Reading(Typed):
    """Reports as their stages write them: every field present and no other key (defaults fill
    nothing in, so a key renamed by its writer is refused, not read as its default), each
    refusal worded in JSON's terms."""

    Problem = Mismatch

    def record(self, tp: type, value: object, at: str) -> Any:
        data = self.expect(dict, value, at)
        fields = record_fields(tp)
        missing = [n for n in fields if n not in data]
        unknown = [k for k in data if k not in fields]
        if missing:
            close = difflib.get_close_matches(missing[0], unknown, n=1)
            instead = f' (the file has "{close[0]}" instead)' if close else ""
            raise Mismatch(at, f'key "{missing[0]}" is missing{instead}')
        if unknown:
            raise Mismatch(at, f'unknown key "{unknown[0]}" (the record has no such field)')
        return tp(**{n: self.read(t, data[n], field_at(at, n)) for n, (_, t) in fields.items()})

    def entry(self, at: str, key: object) -> str:
        return f'{at}["{key}"]'

    def name(self, tp: Any) -> str:
        if tp is dict or dataclasses.is_dataclass(tp):
            return "an object"
        return _NAMES.get(tp, getattr(tp, "__name__", str(tp)))

    def refuse(self, value: object, belongs: str, at: str) -> Exception:
        return Mismatch(at, f"{_shown(value)} where {belongs} belongs")

    def not_among(self, value: object, choices: tuple, at: str) -> Exception:
        return self.refuse(value, " or ".join(map(_shown, choices)), at)


_NAMES = {
    type(None): "null",
    int: "a whole number",
    float: "a number",
    str: "a string",
    bool: "true or false",
    list: "a list",
}
_READING = _Reading()


def decode(tp: Any, value: object) -> Any:
    """`value` (parsed JSON) as type `tp`, or Mismatch saying where it is not."""
    return _READING.read(tp, value, "")


def _shown(value: object) -> str:
    return "null" if value is None else json.dumps(value, default=repr)[:60]
