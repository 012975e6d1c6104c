"""The layers the extract stage captures: those of every drafter family in extract.drafters,
each family's as its own section names them (EAGLE-3 `extract.layers`, DFlash `dflash`), once."""

from __future__ import annotations

from ..cli import params_key
from ..dflash.layers import hf_indices_read
from ..params.dflash import DFlashParams
from ..params.extract import ExtractParams
from .capture import aux_indices


def drafter_layers(
    params: ExtractParams, dflash: DFlashParams, num_layers: int
) -> dict[str, list[int]]:
    """The HF hidden-state indices each family of `extract.drafters` reads, in its order:
    EAGLE-3 `extract.layers` (or [2, N // 2, N - 3]); DFlash `dflash.target_layer_ids` (or
    what SGLang picks for `dflash.num_layers` draft layers), each id k being HF index k + 1."""
    layers = {}
    if "eagle3" in params.drafters:
        layers["eagle3"] = aux_indices(params, num_layers)
    if "dflash" in params.drafters:
        with params_key("dflash.target_layer_ids"):
            layers["dflash"] = hf_indices_read(
                dflash.target_layer_ids, num_layers, dflash.num_layers
            )
    return layers


def captured_layers(layers: dict[str, list[int]]) -> list[int]:
    """What the extract stage captures: every family's layers, once, ascending."""
    return sorted({i for family in layers.values() for i in family})
