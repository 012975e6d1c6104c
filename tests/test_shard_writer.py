"""ShardWriter (stages/artifacts/hidden.py): shards written by several threads side by side, `put`
waiting for the oldest write (what frees the extraction's host buffers in the order they are
reused), every shard complete with its checksum, a failed write raised at the next put."""

from __future__ import annotations

import threading
import time

import pytest
import safetensors.torch
import torch
from safetensors.torch import load_file

from stages.artifacts import hidden
from stages.runtime.io import checksum_problem


class SlowSave:
    """save_file that takes `seconds` and records when each shard's write ran."""

    def __init__(self, seconds: float, fail: str | None = None):
        self.seconds, self.fail = seconds, fail
        self.spans: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()
        self.save = safetensors.torch.save_file

    def __call__(self, tensors, path, metadata=None):
        start = time.monotonic()
        time.sleep(self.seconds)
        if self.fail and self.fail in metadata["shard_key"]:
            raise OSError(f"cannot write {path}")
        self.save(tensors, path, metadata=metadata)
        with self.lock:
            self.spans[metadata["shard_key"]] = (start, time.monotonic())


def shard(k: int) -> dict[str, torch.Tensor]:
    return {"aux": torch.full((4, 6), float(k)), "input_ids": torch.arange(4, dtype=torch.int32)}


def test_writes_run_side_by_side_and_put_waits_for_the_oldest(tmp_path, monkeypatch):
    save = SlowSave(0.3)
    monkeypatch.setattr(safetensors.torch, "save_file", save)  # what save_safetensors calls
    puts = []
    with hidden.ShardWriter(workers=2) as writer:
        for k in range(5):
            writer.put(shard(k), hidden.shard_path(tmp_path, k), {"shard_key": f"k{k}"})
            puts.append(time.monotonic())
    spans = [save.spans[f"k{k}"] for k in range(5)]
    assert spans[1][0] < spans[0][1]  # the first two ran side by side
    for k in range(2, 5):  # shard k was put once shard k - 2 was written, not before
        assert puts[k] >= spans[k - 2][1] and spans[k][0] >= spans[k - 2][1]
    assert writer.times.save_s >= 5 * 0.3 and writer.times.writer_wait_s > 0
    for k in range(5):
        path = hidden.shard_path(tmp_path, k)
        assert checksum_problem(path) is None
        assert torch.equal(load_file(str(path))["aux"], shard(k)["aux"])


def test_a_failed_write_is_raised_at_the_next_put_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors.torch, "save_file", SlowSave(0.0, fail="k1"))
    with pytest.raises(OSError, match="cannot write"), hidden.ShardWriter(workers=2) as writer:
        for k in range(4):
            writer.put(shard(k), hidden.shard_path(tmp_path, k), {"shard_key": f"k{k}"})
            time.sleep(0.1)  # the failure has happened before the next put
    assert k == 2  # raised by the put after the failed one
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shard-00000.safetensors",
        "shard-00000.safetensors.sha256.json",
    ]
