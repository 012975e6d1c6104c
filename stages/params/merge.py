"""The `merge` section."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Section, param

MIN_MERGE_MEMORY_GB = 2.0


@dataclass(frozen=True)
class MergeParams(Section):
    """Dedupe, shuffle, split and cut the generated samples."""

    KEY = "merge"

    seed: int = param(0, "Seed of the shuffle and the split.")
    eval_fraction: float = param(0.05, "Share of samples held out for evaluation.", ge=0, le=1)
    max_length: int = param(4096, "Longest training sequence, in tokens.", ge=1)
    memory_limit_gb: float = param(
        4.0,
        "DuckDB's buffers; what does not fit goes to a temporary folder inside the output "
        "folder. Shapes no output.",
        ge=MIN_MERGE_MEMORY_GB,
    )
    threads: int | None = param(
        None, "DuckDB's workers (one writes the split files); null: every core.", ge=1
    )
