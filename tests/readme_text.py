"""The README's text and the commands it gives, for the tests that hold it to the project and the
GPU script that runs its GPU commands as written (tests/perf/readme_gpu.py), each filled in only
where a user fills it in for their machine."""

from __future__ import annotations

import re
import shlex
import sys

from tests.project import ROOT

README = (ROOT / "README.md").read_text()


def section(heading: str) -> str:
    """The README's text under `heading`, up to the next heading of any level."""
    start = README.index(f"{heading}\n")
    end = README.find("\n#", start + len(heading))
    return README[start : end if end >= 0 else None]


def readme_commands(text: str = README) -> list[str]:
    """Every command of `text`: each code span, and each line of a bash block (continuation
    lines joined, comments dropped), split at `&&`."""
    spans = [" ".join(s.split()) for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", text)]
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            lines.append(" ".join(re.sub(r"(^|\s)#.*", "", line).split()))
    return [c.strip() for text in spans + lines for c in text.split("&&") if c.strip()]


def readme_command(start: str) -> str:
    """The one README command that starts with `start`."""
    found = [c for c in readme_commands() if c.startswith(start)]
    if len(found) != 1:
        raise LookupError(f"README.md: {len(found)} commands start with {start!r}, not one")
    return found[0]


def as_run_here(command: str, target: str, gpus: int) -> list[str]:
    """The README's `command` with this machine's values: `<target>`, the GPUs per node, and this
    interpreter for `python` and `torchrun`."""
    words = [target if w == "<target>" else w for w in shlex.split(command)]
    if "--nproc-per-node" in words:
        words[words.index("--nproc-per-node") + 1] = str(gpus)
    if words[0] == "python":
        words[0] = sys.executable
    elif words[0] == "torchrun":
        words[:1] = [sys.executable, "-m", "torch.distributed.run"]  # the `torchrun` script's body
    return words
