"""What every section of params.yaml shares: `param()` (a key's default, help and range, from
stages/runtime/fields.py), the checks of types (stages/runtime/typed.py's, which the reports
share), ranges and unknown keys, and params.yaml read with the YAML rules DVC reads it by (YAML
1.2: `3e-3` is a number), so `dvc exp run -S` and the stages see the same values.

A wrong key or type fails before any work starts, with the dotted key path and what is expected,
so a typo in params.yaml never silently falls back to a default.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import re
import typing
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML, YAMLError

from ..runtime.errors import ParamsError
from ..runtime.fields import param as param  # each section declares its keys with it
from ..runtime.typed import Typed, record_fields

PARAMS_FILE = Path("params.yaml")
DEVICE = r"auto|cpu|cuda|cuda:\d+"  # what torch.device takes here (stages/runtime/device.py)

# `api_key_env` names an environment variable, upper case as environment variables are by
# convention: a key pasted there (mixed case, dashes, dots) is refused without being echoed.
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
SECRET_NAME_KEYS = frozenset({"api_key_env"})  # their values are never repeated in an error


def check_env_name(value: str | None, key: str) -> None:
    if value is not None and not ENV_NAME.match(value):
        raise ParamsError(
            f"{key}: must be the NAME of the environment variable that holds the server's API "
            f"key (upper-case letters, digits and _, e.g. SGLANG_API_KEY), never the key "
            f"itself; the value given is not such a name (not shown: it may be a key). Put the "
            f"key in the environment (`export SGLANG_API_KEY=...`) and its name here"
        )


class Ranged:
    """Checks the ranges of its param() keys when built directly in code too (build() checks them
    first, with the key's whole dotted path); KEY names the section in such errors."""

    KEY: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        prefix = self.KEY or type(self).__name__
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            _check_range(getattr(self, f.name), f, f"{prefix}.{f.name}")


class Section(Ranged):
    """A top-level section of params.yaml, named by KEY: `TrainParams.read(path)` is the typed
    `train` section of that file."""

    @classmethod
    def read(cls, path: Path | str = PARAMS_FILE) -> typing.Self:
        return build(cls, load_params(path).get(cls.KEY), f"{path}:{cls.KEY}")


class _Reading(Typed):
    """params.yaml as people edit it: a key left out takes its default, a number outside its
    range is refused, and each refusal shows the value as Python writes it."""

    Problem = ParamsError

    def record(self, tp: type, value: object, at: str) -> Any:
        return build(tp, value, at)

    def entry(self, at: str, key: object) -> str:
        return f"{at}.{key}"

    def name(self, tp: Any) -> str:
        if tp is dict or dataclasses.is_dataclass(tp):
            return "a mapping"
        return {list: "a list", type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))

    def refuse(self, value: object, belongs: str, at: str) -> Exception:
        return ParamsError(f"{at}: expected {belongs}, got {type(value).__name__} {value!r}")

    def not_among(self, value: object, choices: tuple, at: str) -> Exception:
        return ParamsError(f"{at}: {value!r} is not one of {list(choices)}")


_READING = _Reading()


def check_value(value: Any, tp: Any, key: str) -> Any:
    """Validate (and build, for nested dataclasses) one value against its annotation."""
    return _READING.read(tp, value, key)


def unknown_key(key: str, name: str, known: list[str]) -> str:
    """An unknown key's error: the key (`name` its last part), the nearest known one if any is
    close, and all of them."""
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6) or [
        k
        for k in known
        if k == "".join(w[:1] for w in str(name).split("_"))  # learning_rate: lr
    ]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: unknown key{hint} (known: {', '.join(known)})"


def _check_range(value: Any, f: dataclasses.Field, key: str) -> None:
    """A number outside the key's range (param's ge / gt / le / lt), or a string off its
    pattern, names the key and what is allowed."""
    pattern = f.metadata.get("pattern")
    if pattern and isinstance(value, str) and not re.fullmatch(pattern, value):
        raise ParamsError(f"{key}: {value!r} is not one of {allowed_range(f)}")
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    ge, gt, le, lt = (f.metadata.get(k) for k in ("ge", "gt", "le", "lt"))
    if (
        (ge is not None and value < ge)
        or (gt is not None and value <= gt)
        or (le is not None and value > le)
        or (lt is not None and value >= lt)
    ):
        raise ParamsError(f"{key}: {value!r} is out of range; allowed: {allowed_range(f)}")


def allowed_range(f: dataclasses.Field) -> str:
    """The range a key's number must lie in, as docs/params.md and errors write it."""
    ge, gt, le, lt = (f.metadata.get(k) for k in ("ge", "gt", "le", "lt"))
    if f.metadata.get("pattern"):
        return str(f.metadata["pattern"]).replace("|", " | ").replace(r"\d+", "N")
    low = f">= {ge:g}" if ge is not None else f"> {gt:g}" if gt is not None else ""
    high = f"<= {le:g}" if le is not None else f"< {lt:g}" if lt is not None else ""
    return " and ".join(p for p in (low, high) if p)


def build(cls: type, raw: Any, key: str):
    """Build dataclass `cls` from a params mapping; unknown or missing keys name their path."""
    raw = _READING.expect(dict, {} if raw is None else raw, key)
    fields = record_fields(cls)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParamsError(unknown_key(f"{key}.{unknown[0]}", unknown[0], sorted(fields)))
    values = {}
    for name, (f, tp) in fields.items():
        if name in raw and name in SECRET_NAME_KEYS:
            try:
                values[name] = check_value(raw[name], tp, f"{key}.{name}")
            except ParamsError:
                raise ParamsError(
                    f"{key}.{name}: expected the name of an environment variable (a string) or "
                    f"null (the value is not shown: it may be a key)"
                ) from None
        elif name in raw:
            values[name] = check_value(raw[name], tp, f"{key}.{name}")
            _check_range(values[name], f, f"{key}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamsError(f"{key}.{name}: required key is missing")
    return cls(**values)


def load_params(path: Path | str = PARAMS_FILE) -> dict:
    """params.yaml as a mapping, parsed once per content (every stage reads several sections)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: not found; run from the project root or pass --params")
    data = path.read_bytes()
    if _parsed.get(path) is None or _parsed[path][0] != data:
        _parsed[path] = (data, _parse(path, data))
    return copy.deepcopy(_parsed[path][1])


_parsed: dict[Path, tuple[bytes, dict]] = {}


def _parse(path: Path, data: bytes) -> dict:
    try:
        raw = YAML(typ="safe", pure=True).load(data.decode("utf-8")) or {}
    except YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ParamsError(f"{path}: not valid YAML{where} ({problem}); fix the file") from None
    except UnicodeDecodeError as err:
        raise ParamsError(
            f"{path}: not a YAML text file (not UTF-8 at byte {err.start}); is it the params file?"
        ) from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return raw
