"""A parsed JSON or YAML value read as the type its dataclass field declares, one walk over the
annotation for both files read that way: params.yaml (stages/params/schema.py) and the stages'
reports (stages/reports/record.py). Both then accept the same values (an int where a float
belongs, never a bool where an int does) and name where a refused one sits (`merge.seed`,
`temperatures["0.7"].tau`).

What differs, a subclass of Typed says: how a record's keys are checked (params fill in defaults,
reports must hold every field) and how a refusal reads (params are edited by people, reports are
written by stages).
"""

from __future__ import annotations

import dataclasses
import functools
import types
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Union, get_args, get_origin, get_type_hints


@functools.cache
def record_fields(tp: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """A record's init fields, each with its declared type, in declaration order."""
    hints = get_type_hints(tp)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(tp) if f.init}


def field_at(at: str, name: str) -> str:
    """Where a record's field sits: `at.name`, or `name` at the top."""
    return f"{at}.{name}" if at else name


class Typed(ABC):
    """Reads a value as an annotation: a record (a dataclass), X | Y, Literal, dict, list, int,
    float, str or bool."""

    Problem: ClassVar[type[Exception]]  # what its refusals raise; a union tries its next type

    def read(self, tp: Any, value: object, at: str) -> Any:
        """`value` as type `tp` (a record built, a float from an int), or Problem naming `at`."""
        origin = get_origin(tp)
        if tp is Any:
            return value
        if origin in (Union, types.UnionType):
            return self._union(get_args(tp), value, at)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.record(tp, value, at)
        if tp is dict or origin in (dict, Mapping):
            return self._mapping(get_args(tp), value, at)
        if tp is list or origin is list:
            return self._list(get_args(tp), value, at)
        if origin is Literal:
            if value not in get_args(tp):
                raise self.not_among(value, get_args(tp), at)
            return value
        return self._scalar(tp, value, at)

    def expect(self, kind: type, value: object, at: str) -> Any:
        """`value` if it is a `kind` (dict or list), else Problem."""
        if not isinstance(value, kind):
            raise self.refuse(value, self.name(kind), at)
        return value

    def _union(self, options: tuple, value: object, at: str) -> Any:
        if value is None and type(None) in options:
            return None
        problems = []
        for option in (o for o in options if o is not type(None)):
            try:
                return self.read(option, value, at)
            except self.Problem as err:
                problems.append(err)
        if len(problems) == 1:
            raise problems[0]
        raise self.refuse(value, " or ".join(map(self.name, options)), at)

    def _mapping(self, args: tuple, value: object, at: str) -> Any:
        items = self.expect(dict, value, at)
        if not args:
            return items
        key_type, value_type = args
        return {
            self._key(key_type, k, at): self.read(value_type, v, self.entry(at, k))
            for k, v in items.items()
        }

    def _list(self, args: tuple, value: object, at: str) -> Any:
        items = self.expect(list, value, at)
        return [self.read(args[0], v, f"{at}[{i}]") for i, v in enumerate(items)] if args else items

    def _key(self, tp: Any, key: object, at: str) -> Any:
        """A mapping's key as its type: JSON keys are text (a temperature 0.7 as "0.7")."""
        if tp is str or not isinstance(key, str):
            return key
        try:
            return tp(key)
        except ValueError:
            raise self.refuse(key, self.name(tp), self.entry(at, key)) from None

    def _scalar(self, tp: Any, value: object, at: str) -> Any:
        if tp not in (int, float, str, bool):
            raise TypeError(f"a field of type {tp!r}, which stages/runtime/typed.py cannot read")
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise self.refuse(value, self.name(tp), at)
        return value

    @abstractmethod
    def record(self, tp: type, value: object, at: str) -> Any:
        """The record `value` holds, its keys checked as the subclass's files require."""

    @abstractmethod
    def entry(self, at: str, key: object) -> str:
        """Where a mapping's value sits."""

    @abstractmethod
    def name(self, tp: Any) -> str:
        """A type as a refusal names it."""

    @abstractmethod
    def refuse(self, value: object, belongs: str, at: str) -> Exception:
        """The Problem of `value` at `at`, where `belongs` (a type's name) belongs."""

    @abstractmethod
    def not_among(self, value: object, choices: tuple, at: str) -> Exception:
        """The Problem of `value` at `at`, which is none of a Literal's `choices`."""
