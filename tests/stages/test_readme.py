"""The README as written: its lists match what they list (the named questions, the stages), its
commands' tools are installed and take the options it gives them, the ones that need only a
finished demo answer, and `make setup` with another torch build replaces the torch it installed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.queries.session import catalog
from tests.project import ROOT
from tests.readme_text import README, readme_commands, section

BIN = Path(sys.executable).parent
PATH = f"{BIN}:{os.environ['PATH']}"
# The tools `make setup` installs whose options the README gives; vLLM and speculators the README
# leaves to be installed by hand on the GPU machine; `until` is the shell's.
INSTALLED_TOOLS = ("eagle-pipeline", "dvc", "hf", "pre-commit", "torchrun")
NOT_INSTALLED = {"vllm", "speculators", "until"}
OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
WORD = re.compile(r"[a-z][a-z-]*")


def tool_uses() -> dict[tuple[str, ...], set[str]]:
    """{(tool, its subcommand words): the options the README gives it} for INSTALLED_TOOLS."""
    uses: dict[tuple[str, ...], set[str]] = {}
    for command in readme_commands():
        words = command.replace("\\|", " ").split()
        if not words or words[0] not in INSTALLED_TOOLS:
            continue
        if "-m" in words:  # what follows is the module's (tools/prose_paths.py checks those)
            words = words[: words.index("-m") + 1]
        sub = []
        for word in words[1:3]:
            if not WORD.fullmatch(word):
                break
            sub.append(word)
        uses.setdefault((words[0], *sub), set()).update(OPTION.findall(" ".join(words[1:])))
    return uses


def test_every_tool_the_readme_runs_is_installed():
    """A command is a code span or bash line of a tool name and a subcommand or an option."""
    for command in readme_commands():
        words = command.split()
        if len(words) < 2 or not WORD.fullmatch(words[0]) or words[0] in NOT_INSTALLED:
            continue
        if WORD.fullmatch(words[1]) or words[1].startswith("-"):
            assert shutil.which(words[0], path=PATH), f"README runs {command!r}: no {words[0]}"


def test_the_readme_names_every_query_there_is():
    text = section("### Asking the data: `eagle-pipeline`")
    listed = text[text.index("answers by name:") : text.index("`eagle-pipeline query` alone")]
    named = re.findall(r"`(\w+)`", listed)
    assert sorted(named) == sorted(n for n, _ in catalog()), "the README's list of questions"


def test_the_readme_stage_table_lists_every_stage():
    listed = re.findall(r"^\| `([\w-]+)", section("## The stages"), re.MULTILINE)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert listed == list(stages), "the README's stage table, in dvc.yaml's order"


def test_eagle_pipeline_query_lists_what_the_readme_lists():
    """`eagle-pipeline query` alone, as the README says, lists the questions it names."""
    proc = subprocess.run(
        [str(BIN / "eagle-pipeline"), "query"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.splitlines()}
    assert all(f"`{name}`" in README for name in listed)


@pytest.mark.slow
@pytest.mark.parametrize("use", sorted(tool_uses()), ids=" ".join)
def test_each_tool_the_readme_runs_is_installed_and_takes_its_options(use, tmp_path):
    """`--help` of each (tool, subcommand) the README runs, outside any repo: every option the
    README gives it is in the help."""
    tool = shutil.which(use[0], path=str(BIN))
    assert tool, f"README: {use[0]} is not installed by `make setup` (in {BIN})"
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", PATH=PATH)
    proc = subprocess.run(
        [tool, *use[1:], "--help"], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, f"{' '.join(use)} --help: {proc.stdout}{proc.stderr}"
    missing = [
        o for o in tool_uses()[use] if not re.search(rf"(?<![\w-]){o}(?![\w-])", proc.stdout)
    ]
    assert not missing, f"README: {' '.join(use)} takes no {missing}"


@pytest.mark.slow
def test_the_commands_over_a_finished_demo_answer_as_written():
    """The serving commands the README prints from a finished demo (`make demo`)."""
    if not (ROOT / "models" / "drafter" / "config.json").exists():
        pytest.skip("no finished demo run here (models/drafter/config.json); `make demo` first")
    commands = readme_commands()
    ids_line = next(c for c in commands if c.startswith("python -c") and "layer_ids" in c)
    proc = subprocess.run(
        [sys.executable, *shlex.split(ids_line)[1:]], cwd=ROOT, capture_output=True, text=True
    )
    config = json.loads((ROOT / "models" / "drafter" / "config.json").read_text())
    assert proc.stdout.strip() == str(config["eagle_aux_hidden_state_layer_ids"]), proc.stderr
    launch = next(c for c in commands if c.startswith("eagle-pipeline launch-line --drafter"))
    words = shlex.split(launch)
    proc = subprocess.run(
        [str(BIN / words[0]), *words[1:]], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    printed = shlex.split(proc.stdout)
    shown = next(c for c in commands if "--speculative-draft-model-path models/drafter" in c)
    for option in OPTION.findall(shown):
        assert option in printed, f"README's SGLang line has {option}; launch-line: {printed}"


def test_make_setup_with_another_torch_build_replaces_torch(tmp_path):
    """`make setup TORCH_SPEC=torch` in an environment set up before reinstalls torch (and
    nothing else); the same build asked for again does nothing (`make -n`: nothing runs)."""
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()
    (tmp_path / ".venv" / "bin" / ".installed").touch()

    def dry_run(*args: str) -> str:
        proc = subprocess.run(
            ["make", "-n", "setup", *args], cwd=tmp_path, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    first = dry_run()
    stamp = re.search(r"^touch (\.venv/bin/\.torch-\S+)$", first, re.MULTILINE)
    assert stamp and '"torch==' in first, first
    (tmp_path / stamp.group(1)).touch()
    assert "pip" not in dry_run()
    switch = dry_run("TORCH_SPEC=torch")
    assert "pip uninstall -y torch" in switch and 'pip install --progress-bar off "torch"' in switch
    assert "constraints.txt" not in switch, "only torch is reinstalled"
