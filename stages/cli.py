"""Entry point shared by the stage modules: a typer command whose expected errors end the process
with one clear line (which file, row or key, and what would fix it) instead of a traceback."""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from .engines import EngineError

# A path the stage's command in dvc.yaml passes (`--out data/...`): paths live in dvc.yaml only.
PathOpt = Annotated[Path, typer.Option()]


class StageError(RuntimeError):
    """A stage cannot go on; the message says why and what would fix it."""


# OS errors a stage reports in one line: a full disk or quota, a folder it may not write, an
# output folder another process holds (stages/runtime WriteFailed, OutputLocked), another
# torchrun rank lost (stages/runtime/parallel.py CollectiveFailed)
ONE_LINE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EBUSY,
        errno.ECONNABORTED,
    }
)


@contextlib.contextmanager
def params_key(key: str) -> Iterator[None]:
    """Prefix a library error with the params key (section) whose values caused it: the library
    speaks of its own arguments, and the same code serves several stages."""
    try:
        yield
    except (ValueError, KeyError, FileNotFoundError, EngineError) as err:
        raise StageError(f"{key}: {err.args[0] if err.args else err}") from err


def run(main: Callable) -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(main)
    try:
        app(standalone_mode=False)
    except (StageError, EngineError, ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except OSError as err:
        if err.errno not in ONE_LINE_ERRNOS:
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as err:  # click usage errors and the like
        if type(err).__module__.startswith(("click", "typer")):  # typer vendors click too
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise


def summary(tag: str, values: dict) -> str:
    """A stage's closing figures for people: one `name  value` line each, under `[tag]`, nested
    figures as dotted names, numbers with thousands separators (the JSON report keeps them all
    exactly)."""

    def flat(prefix: str, value) -> list[tuple[str, object]]:
        if isinstance(value, dict):
            return [i for k, v in value.items() for i in flat(f"{prefix}{k}.", v)]
        return [(prefix[:-1], value)]

    def shown(value) -> str:
        if isinstance(value, bool) or value is None:
            return str(value).lower() if isinstance(value, bool) else "-"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"
        if isinstance(value, list) and len(value) > 8:
            return f"[{len(value)} values]"
        return str(value)

    items = [i for k, v in values.items() for i in flat(f"{k}.", v)]
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join([f"[{tag}]"] + [f"  {k:<{width}}  {shown(v)}" for k, v in items])
