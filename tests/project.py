"""Run the real pipeline in a temporary git + DVC copy of the project."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def sh(cmd: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def copy_project(dst: Path, edit_params=None) -> Path:
    """Copy the tracked (and not ignored) files to `dst`, edit params.yaml, commit."""
    files = sh(["git", "ls-files", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    for rel in files.splitlines():
        if (ROOT / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, dst / rel)
    if edit_params:
        set_params(dst, edit_params)
    sh(["git", "init", "-q"], dst)
    sh(["git", "add", "-A"], dst)
    sh(["git", "commit", "-qm", "copy"], dst)
    return dst


def set_params(repo: Path, edit) -> None:
    path = repo / "params.yaml"
    params = yaml.safe_load(path.read_text())
    edit(params)
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))
