"""A stand-in for SGLang, of exactly the symbols stages/engines/sglang_capture.py imports, for
tests on machines without SGLang (or a GPU).

Its model runner computes every forward with the Hugging Face model of the checkpoint (fp32, CPU,
one sequence at a time) and captures the layers the way SGLang's model code turns the ids given
to `set_eagle3_layers_to_capture` into layers, for the family and the version it reports: an id
the engine gets wrong comes back as the wrong layer's features. The version is the installed
distribution's (`importlib.metadata.version("sglang")`), which `activate` writes.

What the runner was given and ran is recorded (`sglang._fake.RECORD`, and with FAKE_SGLANG_RECORD
set, one JSON line per event in that file per rank) so tests can check the server arguments, the
ids and the forwards.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent


def write_distribution(where: Path, version: str) -> Path:
    """A `sglang-<version>.dist-info` under `where`, so importlib.metadata reports `version`."""
    info = Path(where) / f"sglang-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return Path(where)


def forget() -> None:
    """Drop the imported stand-in modules, so the next import reads them (and the version) anew."""
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def pythonpath(where: Path) -> str:
    """PYTHONPATH entries for a subprocess that should import the stand-in of `where`'s version."""
    return f"{ROOT}:{where}"
