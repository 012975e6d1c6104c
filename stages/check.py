"""check: every key of params.yaml against the typed params, before any other stage runs.

A stage reads only its own section, so a key no stage reads (a typo such as `train.learning_rate`
for `train.lr`) would rerun nothing and be ignored. This stage depends on the whole params.yaml
file, so any edit reruns it; every other stage depends on its output, so DVC runs it first and
stops at its error, one line naming the key and what is allowed, before it has removed or
rewritten any other stage's outputs. A check that passes writes the same file again, so it
reruns nothing downstream.
"""

from __future__ import annotations

from pathlib import Path

from . import config
from .cli import PathOpt, run
from .runtime.files import write_json


def main(out: PathOpt, params: Path = config.PARAMS_FILE) -> None:
    """Check every key of params.yaml (unknown keys, types, ranges) before any stage runs."""
    config.check_all(params)  # ParamsError on the first bad key
    write_json({"params": "checked"}, out)  # the same bytes whenever the check passes
    print(f"[check] {params}: every key known, of its type and in its range")


if __name__ == "__main__":
    run(main)
