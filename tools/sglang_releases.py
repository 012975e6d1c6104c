"""Fetch the source of every supported SGLang release for the contract tests.

    python tools/sglang_releases.py

Each release's wheel is downloaded from the package registry without its dependencies and its
`sglang/` package unpacked under `.sglang-releases/<version>/` (ignored by git and DVC; a folder
named like a version is no import path, so the project can never import it by accident).
Releases already there are kept. Without registry access it says so and exits 0, and the
contract tests skip with that reason; with CI set it exits 1, since CI must check every release.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stages.capture.releases import SUPPORTED_VERSIONS  # noqa: E402

RELEASES = ROOT / ".sglang-releases"
# The wheel of one platform, so every host reads the same files (the Python source is the same
# in each of a release's wheels).
PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--platform",
    "manylinux_2_34_x86_64",
]


def fetch(version: str) -> str | None:
    """Unpack `version` under RELEASES; None when done, else why it could not be."""
    target = RELEASES / version
    if (target / "sglang" / "__init__.py").exists():
        return None
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp]
        done = subprocess.run(
            [*command, *PLATFORM, f"sglang=={version}"], capture_output=True, text=True
        )
        wheels = list(Path(tmp).glob("sglang-*.whl"))
        if done.returncode or not wheels:
            return f"pip download sglang=={version} failed: {done.stderr.strip()[-400:]}"
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(unpacked, [n for n in wheel.namelist() if n.startswith("sglang/")])
        RELEASES.mkdir(exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        unpacked.rename(target)  # complete or absent
    return None


def main() -> int:
    failures = []
    for version in SUPPORTED_VERSIONS:
        why = fetch(version)
        print(f"SGLang {version}: {why or f'source under {RELEASES / version}'}")
        if why:
            failures.append(why)
    if failures and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return 1
    if failures:
        print("the SGLang contract tests will skip the releases above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
