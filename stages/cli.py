"""Entry point shared by the stage modules: a typer command whose expected errors end the process
with one clear line (which file, row or key, and what would fix it) instead of a traceback."""
from __future__ import annotations

import sys
from typing import Callable

import typer

from .engines import EngineError


class StageError(RuntimeError):
    """A stage cannot go on; the message says why and what would fix it."""


def run(main: Callable) -> None:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(main)
    try:
        app(standalone_mode=False)
    except (StageError, EngineError, ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as err:  # click usage errors and the like
        if type(err).__module__.startswith("click"):
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise
