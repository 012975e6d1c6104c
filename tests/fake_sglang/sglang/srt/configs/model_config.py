"""Stand-in for sglang.srt.configs.model_config: ModelConfig.from_server_args."""

from __future__ import annotations

import json
from pathlib import Path


class ModelConfig:
    def __init__(self, model_path: str):
        self.model_path = model_path
        self.hf_config = json.loads((Path(model_path) / "config.json").read_text())
        self.architecture = self.hf_config["architectures"][0]
        self.num_hidden_layers = int(self.hf_config["num_hidden_layers"])

    @classmethod
    def from_server_args(cls, server_args, model_path=None, **_kwargs) -> ModelConfig:
        return cls(model_path or server_args.model_path)
