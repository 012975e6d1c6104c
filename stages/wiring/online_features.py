"""The features the train stage computes on each batch when extract stored none
(`extract.store: none`), with the engine meta.json names."""

from __future__ import annotations

import dataclasses

import torch

from ..artifacts.hidden import HiddenMeta
from ..capture.hooks import FeatureExtractor
from ..capture.online import GroupFeatures, OnlineFeatures, RankFeatures
from ..cli import params_key
from ..drafter.training import feature_dtype
from ..params.extract import ExtractParams
from ..params.target import TargetParams
from ..target_model.model import load_causal_lm


def online_features(
    params: ExtractParams,
    target: TargetParams,
    meta: HiddenMeta,
    device: torch.device,
    layers: list[int],
    rank: int = 0,
    world: int = 1,
) -> OnlineFeatures | None:
    """The target run on each training batch at the HF indices `layers` (the drafter's own), in
    the dtype it would have stored (meta.json's) then the training dtype: engine hf, a whole
    target on this rank's `device`; sglang, tensor parallel over every rank, with
    `extract.sglang`'s settings. None when the shards hold the features (store all or
    supervised)."""
    if meta.store != "none":
        return None
    stored = getattr(torch, meta.dtype)
    dtype = feature_dtype(device) or stored
    if meta.engine == "sglang":
        from .capture import build_capture  # its hf engine's imports cost seconds: not offline

        recorded = dataclasses.replace(params, layers=layers)
        on_device = dataclasses.replace(target, device=str(device))
        capture = build_capture(recorded, on_device, rank, world)
        return GroupFeatures(capture, rank, world, stored, dtype)
    with params_key("target"):
        # CPU threads: the train stage's own (train.cpu_threads), set before
        model = load_causal_lm(target.path, str(device), target.dtype, target.trust_remote_code)
    with params_key("extract.layers"):
        return RankFeatures(FeatureExtractor(model, layers), stored, dtype)
