"""The embedding and LM head read from a checkpoint without loading the model: a sharded
Kimi-K2.5-style checkpoint (language model nested under `language_model.`, an index mapping keys
to shards), a plain one, and a tied one."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from stages.target_model.weights import embedding_and_head


def sharded(directory, shards: dict[str, dict[str, torch.Tensor]]):
    directory.mkdir()
    weight_map = {}
    for name, tensors in shards.items():
        save_file(tensors, str(directory / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


def test_kimi_k25_layout_in_separate_shards(tmp_path):
    embed, head = torch.randn(16, 4), torch.randn(16, 4)
    path = sharded(
        tmp_path / "k25",
        {
            "model-00001-of-00003.safetensors": {"language_model.model.embed_tokens.weight": embed},
            "model-00002-of-00003.safetensors": {
                "language_model.model.layers.0.mlp.experts.0.up_proj.weight": torch.zeros(2, 4)
            },
            "model-00003-of-00003.safetensors": {
                "language_model.lm_head.weight": head,
                "vision_tower.patch_embed.weight": torch.zeros(3),
            },
        },
    )
    got_embed, got_head = embedding_and_head(path)
    assert torch.equal(got_embed, embed) and torch.equal(got_head, head)


def test_plain_single_file_and_tied(tmp_path):
    embed = torch.randn(8, 2)
    (tmp_path / "tied").mkdir()
    save_file({"model.embed_tokens.weight": embed}, str(tmp_path / "tied" / "model.safetensors"))
    got_embed, got_head = embedding_and_head(tmp_path / "tied")
    assert torch.equal(got_embed, embed) and got_head is got_embed


def test_missing_embedding_names_the_keys_tried(tmp_path):
    path = sharded(tmp_path / "odd", {"a.safetensors": {"transformer.wte.weight": torch.zeros(2)}})
    with pytest.raises(KeyError, match="language_model.model.embed_tokens.weight"):
        embedding_and_head(path)
