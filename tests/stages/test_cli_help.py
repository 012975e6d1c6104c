"""Every option of every stage's command line says what it is (`python -m stages.<s> --help`)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from stages.cli import OPTION_HELP, command
from tests.project import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import structure  # noqa: E402

STAGE_MODULES = sorted({module for module, _ in structure.stage_modules(ROOT).values()})


@pytest.mark.parametrize("module", STAGE_MODULES)
def test_every_stage_option_has_help(module):
    built = command(importlib.import_module(module).main)
    options = [p for p in built.params if p.param_type_name == "option"]
    assert options
    missing = [p.name for p in options if not p.help]
    assert not missing, f"{module}: options without help {missing}; add them to OPTION_HELP"


@pytest.mark.slow
def test_help_is_what_the_user_sees():
    out = subprocess.run(
        [sys.executable, "-m", "stages.merge", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "200", "PATH": ""},
    ).stdout
    assert OPTION_HELP["raw"] in out and OPTION_HELP["params"] in out
