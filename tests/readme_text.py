"""The README's text and the commands it gives, for the tests that hold it to the project and the
GPU script that runs its GPU commands as written (tests/perf/readme_gpu.py)."""

from __future__ import annotations

import re

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
