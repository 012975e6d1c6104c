"""ShardWriter (stages/artifacts/hidden.py): shards written by several threads side by side, `put`
waiting for the oldest write (what frees the extraction's host buffers in the order they are
reused), every shard complete with its checksum, a failed write raised at the next put; the
shard's own writer (stages/runtime/tensor_file.py save_safetensors into an atomic_file) against the
safetensors library's bytes; the host buffers the shards are filled in (FeatureBuffers),
allocated beside the caller."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from stages.artifacts import hidden
from stages.capture.buffers import FeatureBuffers
from stages.runtime import files, tensor_file
from stages.runtime.files import atomic_file, checksum_path, checksum_problem
from stages.runtime.tensor_file import save_safetensors


class SlowSave:
    """save_safetensors that takes `seconds` and records when each shard's write ran."""

    def __init__(self, seconds: float, fail: str | None = None):
        self.seconds, self.fail = seconds, fail
        self.spans: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()
        self.save = hidden.save_safetensors

    def __call__(self, tensors, out, metadata=None):
        start = time.monotonic()
        time.sleep(self.seconds)
        if self.fail and self.fail in metadata["shard_key"]:
            raise OSError(f"cannot write {metadata['shard_key']}")
        self.save(tensors, out, metadata=metadata)
        with self.lock:
            self.spans[metadata["shard_key"]] = (start, time.monotonic())


def shard(k: int) -> dict[str, torch.Tensor]:
    return {"aux": torch.full((4, 6), float(k)), "input_ids": torch.arange(4, dtype=torch.int32)}


@pytest.mark.slow
def test_writes_run_side_by_side_and_put_waits_for_the_oldest(tmp_path, monkeypatch):
    save = SlowSave(0.3)
    monkeypatch.setattr(hidden, "save_safetensors", save)
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
    monkeypatch.setattr(hidden, "save_safetensors", SlowSave(0.0, fail="k1"))
    with pytest.raises(OSError, match="cannot write"), hidden.ShardWriter(workers=2) as writer:
        for k in range(4):
            writer.put(shard(k), hidden.shard_path(tmp_path, k), {"shard_key": f"k{k}"})
            time.sleep(0.1)  # the failure has happened before the next put
    assert k == 2  # raised by the put after the failed one
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shard-00000.safetensors",
        "shard-00000.safetensors.sha256.json",
    ]


@pytest.mark.parametrize("key", ["k", "a longer key"])  # two header lengths: padded differently
def test_a_shard_has_the_bytes_safetensors_writes_and_the_hash_of_those_bytes(
    tmp_path, key, monkeypatch
):
    tensors = {
        "aux": torch.randn(5, 6).to(torch.bfloat16),
        "last": torch.randn(6, 5).t(),  # not contiguous
        "input_ids": torch.arange(5, dtype=torch.int32),
        "loss_mask": torch.tensor([0, 1, 1, 0, 1], dtype=torch.bool),
        "counts": torch.arange(3, dtype=torch.int64),
        "empty": torch.zeros(0, 4, dtype=torch.float16),
        **{  # one of each other dtype: where safetensors puts it
            f"t{i}": torch.arange(4).to(dtype)
            for i, dtype in enumerate(
                [torch.uint8, torch.int8, torch.int16, torch.float64, torch.float32, torch.int64]
                + [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.int32]
            )
        },
    }
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    save_file({k: t.contiguous() for k, t in tensors.items()}, str(theirs), {"shard_key": key})
    want = hashlib.sha256(theirs.read_bytes()).hexdigest()
    monkeypatch.setattr(tensor_file, "WRITE_CHUNK", 7)  # many writes, each hashed beside the next
    monkeypatch.setattr(files.hashlib, "sha256", SlowSha256)
    with atomic_file(ours) as out:
        save_safetensors(tensors, out, {"shard_key": key})
    assert ours.read_bytes() == theirs.read_bytes()
    assert json.loads(checksum_path(ours).read_text())["sha256"] == want
    assert checksum_problem(ours) is None


class SlowSha256:
    """sha256 whose updates come late, as a large one does: a digest read before they are all
    done is wrong."""

    def __init__(self):
        self.real = REAL_SHA256()

    def update(self, data) -> None:
        time.sleep(0.002)
        self.real.update(data)

    def hexdigest(self) -> str:
        return self.real.hexdigest()


REAL_SHA256 = hashlib.sha256


def test_a_dtype_safetensors_lacks_is_named_with_its_tensor(tmp_path):
    with (
        pytest.raises(ValueError, match="tensor 'z'.*complex64"),
        atomic_file(tmp_path / "x") as out,
    ):
        save_safetensors({"z": torch.zeros(2, dtype=torch.complex64)}, out)
    assert list(tmp_path.iterdir()) == []


def test_feature_buffers_are_allocated_beside_the_caller(monkeypatch):
    """Construction returns before any set is allocated (pinning 10 GiB took 6.8 s before the
    first forward on an H200 host), take waits for its set, the sets come round in turn, and
    the allocations' own time is counted."""
    release = threading.Event()
    empty = torch.empty

    def gated(*args, **kwargs):
        assert release.wait(5), "FeatureBuffers allocated its sets on the caller's thread"
        time.sleep(0.05)
        return empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", gated)
    buffers = FeatureBuffers(8, 6, 2, torch.float32, pin=False, sets=2)
    release.set()
    aux, last = buffers.take(5)
    assert (tuple(aux.shape), tuple(last.shape)) == ((5, 6), (5, 2))
    second, _ = buffers.take(8)
    again, _ = buffers.take(3)
    assert second.data_ptr() != aux.data_ptr() and again.data_ptr() == aux.data_ptr()
    assert 0.2 <= buffers.allocation_s() < 5  # 2 sets x 2 tensors x 0.05 s on their thread


def test_feature_buffers_raise_an_allocation_failure_at_take(monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("CUDA error: out of memory (pinned host memory)")

    monkeypatch.setattr(torch, "empty", fails)
    buffers = FeatureBuffers(8, 6, 2, torch.float32, pin=False, sets=2)
    with pytest.raises(RuntimeError, match="pinned host memory"):
        buffers.take(4)
