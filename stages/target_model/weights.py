"""Read single tensors of a target checkpoint without loading the model (a 1T-parameter target
has its embedding and LM head in two of hundreds of shards)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

# Plain causal LMs, then multimodal wrappers (Kimi-K2.5 nests its DeepSeek-V3 language model
# under `language_model.`).
EMBED_KEYS = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",
    "language_model.model.embed_tokens.weight",
    "embed_tokens.weight",
)
HEAD_KEYS = ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight")


def _key_files(path: Path) -> dict[str, Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        return {k: path / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.exists():
        raise FileNotFoundError(
            f"{path}: no model.safetensors or model.safetensors.index.json; "
            f"the target must be a local safetensors checkpoint"
        )
    with safe_open(str(single), "pt") as f:
        return {k: single for k in f.keys()}


def load_tensor(path: Path | str, candidates: tuple[str, ...]) -> torch.Tensor | None:
    files = _key_files(Path(path))
    for key in candidates:
        if key in files:
            with safe_open(str(files[key]), "pt") as f:
                return f.get_tensor(key)
    return None


def embedding_and_head(path: Path | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's token embedding [V, H] and LM head [V, H] (the embedding when tied)."""
    embed = load_tensor(path, EMBED_KEYS)
    if embed is None:
        raise KeyError(f"{path}: no token embedding among {EMBED_KEYS}")
    head = load_tensor(path, HEAD_KEYS)
    return embed, embed if head is None else head
