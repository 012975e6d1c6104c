"""Stand-ins for SGLang's supported releases, for tests on machines without SGLang (or a GPU).

`v0_5_14/sglang` and `v0_5_23/sglang` hold, for one release of the first and of the last group
of model-runner APIs (stages/capture/runners.py), exactly the modules and names of the release
that its adapter uses, with the release's own signatures (held to
them by tests/sglang_contract/test_stand_in.py); what they share lives in `fake_core.py`. The
model runner computes every forward with the Hugging Face model of the checkpoint (fp32, CPU, one
sequence at a time) and captures the layers the way SGLang's model code turns capture ids into
layers, so an id the engine gets wrong comes back as another layer's features. The version the
engine sees is the installed distribution's (`importlib.metadata.version("sglang")`), which
`write_distribution` sets.

What the runner was given and ran is recorded (`fake_core.RECORD`, and with FAKE_SGLANG_RECORD
set, one JSON line per event in that file per rank) so tests can check the server arguments, the
ids and the forwards.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
CORE = ROOT / "fake_core.py"
# The releases with a stand-in; every other supported release is held to its adapter by the
# contract test alone (tests/sglang_contract/test_capture_engine.py).
STAND_INS = ("0.5.14", "0.5.23")


def stand_in(version: str) -> Path:
    """The folder holding the stand-in `sglang` package of `version` (0.5.14 | 0.5.23)."""
    return ROOT / f"v{version.replace('.', '_')}"


def write_distribution(where: Path, version: str) -> Path:
    """A `sglang-<version>.dist-info` under `where`, so importlib.metadata reports `version`."""
    info = Path(where) / f"sglang-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return Path(where)


def forget() -> None:
    """Drop the imported stand-in modules, so the next import reads them (and the version) anew."""
    for name in [m for m in sys.modules if m in ("sglang", "fake_core") or m.startswith("sglang.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def pythonpath(package: str, where: Path) -> str:
    """PYTHONPATH entries for a subprocess that should import the stand-in of release `package`
    while the distribution under `where` reports its version."""
    return f"{stand_in(package)}:{ROOT}:{where}"
