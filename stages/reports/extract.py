"""reports/extract.json, written by the extract stage and read by the report stage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .record import Report


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
