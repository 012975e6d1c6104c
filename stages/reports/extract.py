"""reports/extract.json, written by the extract stage and read by the report stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .record import Report

KIMI_K25_HIDDEN = 7168  # Kimi-K2.5's width, at which each family's own layers are priced too


@dataclass(frozen=True)
class DrafterLayers:
    """The layers one drafter family reads, and what those that no other family reads add to
    every stored token's features."""

    layers: list[int]  # HF hidden_states indices, in the order the family reads them
    only_it_reads: list[int]
    bytes_per_token: int  # of only_it_reads, at the target's width and the storage dtype
    bytes_per_token_at_7168: int  # the same at Kimi-K2.5's width


def layer_costs(
    layers: dict[str, list[int]], hidden_size: int, itemsize: int
) -> dict[str, DrafterLayers]:
    """Each family's layers and the bytes per token the ones it alone reads add."""
    costs = {}
    for family, own in layers.items():
        others = {i for name, read in layers.items() if name != family for i in read}
        alone = [i for i in own if i not in others]
        costs[family] = DrafterLayers(
            layers=list(own),
            only_it_reads=alone,
            bytes_per_token=len(alone) * hidden_size * itemsize,
            bytes_per_token_at_7168=len(alone) * KIMI_K25_HIDDEN * itemsize,
        )
    return costs


@dataclass(frozen=True)
class ExtractReport(Report):
    """What the shards hold and take on disk, the layers captured, and the rate of this run's
    extraction loop (after its warm-up) with where its time went."""

    STAGE: ClassVar[str] = "extract"

    tokens: int  # merged tokens the plan holds
    shards: int
    samples: int
    store: str  # extract.store: all, supervised or none
    bytes: int
    bytes_per_token: int
    bytes_per_token_all: int  # what store all would take
    aux_hf_indices: list[int]  # the HF hidden_states indices captured
    world_size: int
    engine: str
    extracted_tokens: int  # by this run: 0 when every shard was on disk already
    tokens_per_s: float  # this run's loop (0.0 when it extracted nothing)
    warmup_s: float
    time: dict[str, float]  # seconds, by where the loop spent them (stages/extract.py)
    # the layers each family of extract.drafters reads (empty: written before they were)
    drafters: dict[str, DrafterLayers] = field(default_factory=dict)


def eagle3_layers(report: ExtractReport) -> list[int]:
    """The HF indices EAGLE-3 was trained on: its own, or every captured layer in a report from
    before the families were recorded."""
    eagle3 = report.drafters.get("eagle3")
    return eagle3.layers if eagle3 else report.aux_hf_indices
