"""Read the extracted hidden states: index.parquet + safetensors shards, one sample at a time."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors import safe_open

FIELDS = ("aux", "last", "input_ids", "loss_mask")


class HiddenStates:
    """Samples of one split; each is a dict of aux [T, 3H], last [T, H], input_ids, loss_mask."""

    def __init__(self, directory: Path | str, split: str, max_length: int | None = None):
        self.directory = Path(directory)
        index_path = self.directory / "index.parquet"
        if not index_path.exists():
            raise FileNotFoundError(f"{index_path}: no hidden-state index; run the extract stage")
        index = pq.read_table(index_path).to_pylist()
        self.rows = [r for r in index if r["split"] == split]
        self.max_length = max_length
        self._files: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _shard(self, k: int):
        if k not in self._files:
            path = self.directory / f"shard-{k:05d}.safetensors"
            if not path.exists():
                raise FileNotFoundError(f"{path}: listed in index.parquet but missing; rerun extract")
            self._files[k] = safe_open(str(path), "pt")
        return self._files[k]

    def __getitem__(self, i: int) -> dict:
        r = self.rows[i]
        n = r["length"] if self.max_length is None else min(r["length"], self.max_length)
        shard = self._shard(r["shard"])
        return {f: shard.get_slice(f)[r["offset"]: r["offset"] + n] for f in FIELDS}


def collate(samples: list[dict], dtype: torch.dtype | None = torch.float32
            ) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into a batch with an attention mask; features in `dtype`
    (None: as stored)."""
    width = max(s["input_ids"].shape[0] for s in samples)
    dtype = dtype or samples[0]["aux"].dtype
    batch = {
        "aux": torch.zeros(len(samples), width, samples[0]["aux"].shape[-1], dtype=dtype),
        "last": torch.zeros(len(samples), width, samples[0]["last"].shape[-1], dtype=dtype),
        "input_ids": torch.zeros(len(samples), width, dtype=torch.long),
        "loss_mask": torch.zeros(len(samples), width, dtype=torch.bool),
        "attention_mask": torch.zeros(len(samples), width, dtype=torch.bool),
    }
    for b, s in enumerate(samples):
        n = s["input_ids"].shape[0]
        batch["aux"][b, :n] = s["aux"].to(dtype)
        batch["last"][b, :n] = s["last"].to(dtype)
        batch["input_ids"][b, :n] = s["input_ids"].long()
        batch["loss_mask"][b, :n] = s["loss_mask"].bool()
        batch["attention_mask"][b, :n] = True
    return batch
