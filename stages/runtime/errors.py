"""The errors a stage ends with in one line (stages/cli.py prints them without a traceback), kept
at the bottom layer so that raising one needs no import of the stage side or the engines."""

from __future__ import annotations


class StageError(RuntimeError):
    """A stage cannot go on; the message says why and what would fix it."""


class ParamsError(ValueError):
    """A params.yaml key is unknown, missing or of the wrong type."""


class EngineError(RuntimeError):
    """An engine or its server cannot go on; the message names the server and the fix."""
