"""Run a stage's command line in-process, as `python -m stages.<stage>` would."""

from __future__ import annotations

import sys

from stages.cli import run


def run_stage(main, args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a stage's entry point called with `args`."""
    monkeypatch.setattr(sys, "argv", ["stage", *map(str, args)])
    code = 0
    try:
        run(main)
    except SystemExit as done:
        code = done.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err
