"""The prose check of `make check` (tools/prose_paths.py): the tree passes, and a made-up path,
module, name, option, test or make target in a README, a params.yaml comment or a docstring fails,
naming the file and line; outputs, placeholders and paths outside the repo pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.project import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import prose_paths  # noqa: E402

README = """\
# A project

Run `python -m stages.prep --out data/prompts/<d>.parquet` and read `reports/prep/sharegpt.json`,
`reports/canary.pt` and the notes under `../shared/samples/`, or any of `stages/*.py`.
The capture lives in `stages/target_model/capture.py`; [the design](docs/nowhere.md).
`python -m stages.nope`, `python -m stages.prep --no-such-option`,
`pytest tests/test_it.py::test_missing`, `make nothing`, `make check`.
`stages.prep.main` reads `stages.prep.options` and `tests.doubles.server`.
"""


@pytest.fixture
def tree(tmp_path) -> Path:
    """A small repo: a stage module, a test, dvc.yaml's outputs, a Makefile and prose."""
    files = {
        "README.md": README,
        "Makefile": "check:\n\ttrue  # as stages/checks.py does\n",
        "dvc.yaml": (
            "stages:\n  prep:\n    foreach: [a]\n    do:\n      cmd: python -m stages.prep\n"
            "      outs:\n        - data/prompts/${key}.parquet\n"
            "        - reports/prep/${key}.json:\n            cache: false\n"
        ),
        "params.yaml": "prep:  # stages/engines/sglang_capture.py reads it\n  n: 1\n",
        "stages/__init__.py": "",
        "stages/prep.py": "def main(out: str) -> None:\n    pass\n",
        "tests/__init__.py": "",
        "tests/test_it.py": '"""Runs stages/prep.py."""\n\n\ndef test_present():\n    pass\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    return tmp_path


def test_made_up_names_are_caught_with_their_file_and_line(tree):
    nowhere = (
        "is no file or folder of the repo, nor an output of dvc.yaml: name the path it has now"
    )
    assert prose_paths.problems(tree) == [
        f"Makefile:2: stages/checks.py {nowhere}",
        f"README.md:5: stages/target_model/capture.py {nowhere}",
        "README.md:5: the link to docs/nowhere.md leads nowhere: link the file where it is now",
        "README.md:6: python -m stages.nope: no such module (no stages/nope.py): name its module",
        "README.md:6: python -m stages.prep takes no option --no-such-option (see its --help)",
        "README.md:7: tests/test_it.py defines no test test_missing: name one it defines",
        "README.md:7: make nothing: no such target of the Makefile: name one it has",
        "README.md:8: stages.prep.options: no such module or name (stages.prep has no options): "
        "name it where it is now",
        "README.md:8: tests.doubles.server: no such module or name (tests has no doubles): "
        "name it where it is now",
        f"params.yaml:1: stages/engines/sglang_capture.py {nowhere}",
    ]


def test_the_command_line_fails_on_a_made_up_path(tree):
    """What `make check` runs, on a tree with one wrong name."""
    (tree / "tools").mkdir()
    for name in ("prose_paths.py", "structure.py"):
        (tree / "tools" / name).write_text((ROOT / "tools" / name).read_text())
    proc = subprocess.run(
        [sys.executable, "tools/prose_paths.py"], cwd=tree, capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "README.md:5: stages/target_model/capture.py is no file or folder of the repo"
        in proc.stdout
    )


@pytest.mark.slow
def test_the_tree_names_nothing_that_is_not_there():
    assert prose_paths.problems(ROOT) == []
