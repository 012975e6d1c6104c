"""The capture engine params name (`extract.engine`), for this process's rank, and the target's
facts when no capture runs (`extract.store: none`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ..capture.hf import HFCapture
from ..capture.interface import Capture, Role, config_facts
from ..cli import params_key
from ..drafter.layers import default_aux_indices
from ..params.extract import ExtractParams
from ..params.target import TargetParams
from ..target_model.model import load_causal_lm

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def aux_indices(params: ExtractParams, num_layers: int) -> list[int]:
    """The HF hidden-state indices to capture: `extract.layers`, or EAGLE-3's default for a
    target of `num_layers` layers. The extract stage passes the union of every family's layers
    (feature_layers.py) as `extract.layers`."""
    with params_key("extract.layers"):
        return params.layers or default_aux_indices(num_layers)


def build_capture(
    params: ExtractParams, target: TargetParams, rank: int = 0, world: int = 1
) -> Capture:
    """The configured engine's Capture for this process."""
    dtype = DTYPES[params.dtype]
    if params.engine == "sglang":
        from ..capture.sglang_runner import SGLangCapture

        indices = config_only_facts(params, target, rank, world).aux_indices
        s = params.sglang
        with params_key("extract.sglang"):
            return SGLangCapture(
                target.path,
                indices,
                dtype,
                rank=rank,
                world=world,
                local_rank=int(os.environ.get("LOCAL_RANK", rank)),
                tp_size=s.tp_size,
                ep_size=s.ep_size,
                mem_fraction_static=s.mem_fraction_static,
                max_tokens_per_forward=s.max_tokens_per_forward,
                trust_remote_code=target.trust_remote_code,
                model_dtype=target.dtype,
            )
    with params_key("target"):
        model = load_causal_lm(
            target.path, target.device, target.dtype, target.trust_remote_code, target.cpu_threads
        )
    indices = aux_indices(params, model.config.num_hidden_layers)
    with params_key("extract.layers"):
        return HFCapture(
            model, indices, dtype, params.batch_tokens, Role(rank, world, True), params.compile
        )


@dataclass(frozen=True)
class ConfigFacts:
    """What meta.json records of the target when no capture runs (store none)."""

    aux_indices: list[int]
    hidden_size: int
    num_layers: int
    architecture: str
    role: Role


def config_only_facts(
    params: ExtractParams, target: TargetParams, rank: int, world: int
) -> ConfigFacts:
    """The target's facts from its config.json, and this process's share of the shards (every
    process writes its own, as with the hf engine)."""
    with params_key("target"):
        architecture, num_layers, hidden_size = config_facts(target.path)
    indices = aux_indices(params, num_layers)
    return ConfigFacts(indices, hidden_size, num_layers, architecture, Role(rank, world, True))
