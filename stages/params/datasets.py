"""The `datasets` section: one entry per dataset, each a prep@<name> and a generate@<name> stage."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..runtime.errors import ParamsError
from .schema import PARAMS_FILE, Ranged, check_value, load_params, param

# A dataset's name names its files (data/prompts/<name>.parquet, data/raw/<name>/) and stages
# (prep@<name>): letters, digits, _, - and ., not starting with a dot.
DATASET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class PrepParams(Ranged):
    """Where a dataset's prompts come from and how they are cut."""

    format: str = param(help="The source adapter: the dataset's format (see stages/sources).")
    path: str = param(help="The file (or folder) of the dataset.")
    columns: dict | None = param(None, "Column overrides of the adapter (null: its defaults).")
    max_samples: int | None = param(None, "At most this many prompts (null: all).", ge=1)
    max_prompt_tokens: int = param(
        2048, "Longest prompt kept, in tokens (all_turns: of every turn's prompt).", ge=1
    )
    skip_bad_rows: bool = param(False, "Skip malformed rows (counted) instead of failing.")
    seed: int = param(0, "Seed of the sample order.")
    regenerate: Literal["last_turn", "all_turns", "all_turns_rendered"] = param(
        "last_turn",
        "last_turn: the target writes the reply to the last user turn or tool result; "
        "all_turns: every assistant turn in order, each on the target's own earlier turns, a "
        "later prompt the earlier ids concatenated (one training sequence per conversation; "
        "refused for templates that render history differently); all_turns_rendered: the same "
        "turns, a later prompt rendered by the chat template from the conversation so far (one "
        "training sequence per turn).",
    )


@dataclass(frozen=True)
class DatasetGenerateParams(Ranged):
    """How much of a dataset to generate."""

    budget_tokens: int = param(
        10_000_000, "Stop generating this dataset once its outputs hold this many tokens.", ge=1
    )


@dataclass(frozen=True)
class ExpectParams(Ranged):
    """What the quality gate demands of a dataset's outputs."""

    reasoning: bool = param(
        True,
        "true: every generation prompt opens reasoning or leaves it to the target; false: none "
        "opens it (prep fails otherwise), and the gate checks reasoning closes.",
    )
    tool_calls: bool = param(False, "The gate demands tool calls in this dataset's outputs.")


@dataclass(frozen=True)
class DatasetParams(Ranged):
    """One entry of `datasets`: a prep@<name> and a generate@<name> stage."""

    prep: PrepParams = param(help="Where the prompts come from.")
    generate: DatasetGenerateParams = param(
        help="This dataset's generation budget.", factory=DatasetGenerateParams
    )
    expect: ExpectParams = param(help="What the quality gate demands.", factory=ExpectParams)


def read_datasets(path: Path | str = PARAMS_FILE) -> dict[str, DatasetParams]:
    raw = load_params(path).get("datasets")
    if not raw:
        raise ParamsError(f"{path}:datasets: at least one dataset is required")
    if isinstance(raw, dict):
        for name in raw:
            check_dataset_name(name, f"{path}:datasets")
    return check_value(raw, dict[str, DatasetParams], f"{path}:datasets")


def check_dataset_name(name: object, key: str) -> None:
    """A dataset name is a file and stage name: no `/`, no `..`, no NUL or other control
    character, nothing that would put a file outside data/prompts/ or data/raw/."""
    if not isinstance(name, str) or not DATASET_NAME.match(name) or ".." in name:
        raise ParamsError(
            f"{key}: dataset name {name!r} cannot name files and stages (data/raw/<name>/, "
            f"prep@<name>): use letters, digits, _, - and . (not first, and no '..'), at most "
            f"128 characters"
        )


def read_dataset(name: str, path: Path | str = PARAMS_FILE) -> DatasetParams:
    all_ = read_datasets(path)
    if name not in all_:
        raise ParamsError(f"{path}:datasets.{name}: no such dataset; defined: {sorted(all_)}")
    return all_[name]
