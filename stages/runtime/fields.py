"""A setting's declaration, shared by the sections of params.yaml and the library types whose
fields are params keys (the training loop's knobs): its default, what it does, the range a number
must lie in, the pattern a string must match, and whether it changes only how fast a run computes.
The checks themselves live with the params (stages/params/schema.py)."""

from __future__ import annotations

import dataclasses
from typing import Any


def param(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    pattern: str | None = None,
    speed_only: bool = False,
) -> Any:
    """One params.yaml key: its default, what it does (docs/params.md is generated from this
    text by tools/params_doc.py), the range a number must lie in and the pattern a string must
    match (checked with its type, by the check stage as by the stage that reads it), and whether
    it changes only how fast a stage computes, not what it writes (`speed_only`: a run resumes
    across an edit of it)."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt, "pattern": pattern}
    metadata = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if speed_only:
        metadata["speed_only"] = True
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def speed_only_keys(cls: type) -> frozenset[str]:
    """The keys of `cls` declared `speed_only`."""
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("speed_only"))
