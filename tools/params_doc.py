"""docs/params.md, generated from the typed params (stages/params/): every key of params.yaml
with its type, default, allowed values and what it does. The text of each key is the `help` of
its `param()` in stages/params/, the one place it is written.

    python tools/params_doc.py           # write docs/params.md
    python tools/params_doc.py --check   # exit 1 when docs/params.md is not what this writes
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stages.params.schema import allowed_range  # noqa: E402
from stages.params.sections import SECTIONS  # noqa: E402

PAGE = ROOT / "docs" / "params.md"
HEADER = """# Parameters (`params.yaml`)

Every key of `params.yaml`: its type, its default (what a missing key means), the values it
allows and what it does. Each stage reads the sections it needs; an unknown key, a wrong type or a
value out of range stops the run naming the key. This page is generated from the typed params
(`stages/params/`) by `python tools/params_doc.py`; edit the text there.
"""


def nested(tp: Any) -> tuple[type | None, str]:
    """The params dataclass a key holds (directly, or null, or one per name), and how."""
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp, "one"
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        cls, how = nested(inner[0])
        return cls, ("or null" if cls else how)
    if origin is dict:
        args = typing.get_args(tp)
        if args and isinstance(args[1], type) and dataclasses.is_dataclass(args[1]):
            return args[1], "per name"
    return None, ""


def type_text(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [type_text(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(inner) + " or null"
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in typing.get_args(tp))}]"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def value_text(value: Any) -> str:
    """A default as params.yaml writes it."""
    if dataclasses.is_dataclass(value):
        return "(its keys' defaults)"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value}`"


def default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return value_text(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return value_text(f.default_factory())
    return "required"


def anchor(path: str) -> str:
    return path.replace(".", "").replace("<", "").replace(">", "").lower()


def sections() -> list[tuple[str, type, list[str]]]:
    """(first path, class, other paths) of every params class, in the order of params.yaml."""
    found: dict[type, list[str]] = {}

    def walk(cls: type, path: str) -> None:
        if cls in found:
            found[cls].append(path)
            return
        found[cls] = [path]
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            inner, how = nested(hints[f.name])
            if inner is not None:
                walk(inner, f"{path}.{f.name}" + (".<name>" if how == "per name" else ""))

    for name, cls in SECTIONS.items():
        walk(cls, "datasets.<name>" if name == "datasets" else name)
    return [(paths[0], cls, paths[1:]) for cls, paths in found.items()]


def render() -> str:
    out = [HEADER]
    table = sections()
    first = {cls: path for path, cls, _ in table}
    for path, cls, others in table:
        out.append(f"## `{path}`\n")
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(cls.__name__ + "("):
            out.append(" ".join(doc.split()) + "\n")
        if others:
            out.append("Also at " + ", ".join(f"`{p}`" for p in others) + ".\n")
        out.append("| key | type | default | allowed | what it does |")
        out.append("|---|---|---|---|---|")
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            inner, how = nested(hints[f.name])
            what = f.metadata.get("help", "")
            if f.metadata.get("speed_only"):
                what = f"{what} Speed only: an edit resumes the run.".strip()
            if inner is not None:
                target = first[inner]
                what = f"{what} Its keys: [`{target}`](#{anchor(target)}).".strip()
            allowed = allowed_range(f)
            cells = [f"`{f.name}`", type_text(hints[f.name]), default_text(f), allowed, what]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def undocumented() -> list[str]:
    """Keys with no help text: each must say what it does."""
    return [
        f"{path}.{f.name}"
        for path, cls, _ in sections()
        for f in dataclasses.fields(cls)
        if not f.metadata.get("help")
    ]


def main(argv: list[str]) -> int:
    missing = undocumented()
    if missing:
        print(f"stages/params/: keys without help: {missing}")
        return 1
    text = render()
    if "--check" in argv:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE.relative_to(ROOT)} is stale: run `python tools/params_doc.py`")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
