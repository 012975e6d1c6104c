"""Every section of params.yaml and its typed view, in file order: what the check stage builds
before any other stage runs, and docs/params.md lists."""

from __future__ import annotations

import json
from pathlib import Path

from ..runtime.errors import ParamsError
from .benchmark import BenchmarkParams
from .datasets import DatasetParams, read_datasets
from .dflash import DFlashParams
from .extract import ExtractParams
from .generate import GenerateParams
from .merge import MergeParams
from .quality import QualityParams
from .report import ReportParams
from .schema import PARAMS_FILE, Section, load_params, unknown_key
from .target import TargetParams
from .train import TrainParams
from .vocab import VocabParams

# The top-level sections of params.yaml and their typed view (`datasets`: one DatasetParams per
# named dataset).
SECTIONS: dict[str, type] = {
    "target": TargetParams,
    "datasets": DatasetParams,
    "generate": GenerateParams,
    "merge": MergeParams,
    "quality": QualityParams,
    "vocab": VocabParams,
    "extract": ExtractParams,
    "train": TrainParams,
    "dflash": DFlashParams,
    "benchmark": BenchmarkParams,
    "report": ReportParams,
}


def check_all(path: Path | str = PARAMS_FILE) -> None:
    """Every section of the file built as its stage builds it: the first unknown key, wrong type
    or value out of range raises ParamsError naming it."""
    raw = load_params(path)
    for name in raw:
        if name not in SECTIONS:
            raise ParamsError(unknown_key(f"{path}:{name}", str(name), list(SECTIONS)))
    for name, cls in SECTIONS.items():  # one left out is built from its defaults, as stages do
        if name == "datasets":
            read_datasets(path)
        elif issubclass(cls, Section):
            cls.read(path)
    _check_layers(raw, path)


def _check_layers(raw: dict, path: Path | str) -> None:
    """extract.layers against the target's depth, where its config.json is at hand."""
    layers = (raw.get("extract") or {}).get("layers")
    target = Path(str((raw.get("target") or {}).get("path", "")))
    if not layers or not (target / "config.json").is_file():
        return
    cfg = json.loads((target / "config.json").read_text())
    depth = (cfg.get("text_config") or cfg).get("num_hidden_layers")
    outside = [i for i in layers if not 0 <= i <= depth - 1] if isinstance(depth, int) else []
    if outside:
        raise ParamsError(
            f"{path}:extract.layers: HF hidden-state indices {outside} are outside "
            f"0..{depth - 1} for a {depth}-layer target ({target})"
        )
