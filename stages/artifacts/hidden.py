"""The hidden artifact: the target's features per merged sample, in resumable shards.

`<dir>/shard-NNNNN.safetensors` holds aux [T, num_aux * H], last [T, H], input_ids [T] and
loss_mask [T] for consecutive samples, with a `shard_key` in its metadata (the settings and the
exact samples: a shard counts as done only when its key matches); `index.parquet` says where each
sample is (sample_id, split, shard, offset, length); `meta.json` records the HF hidden-state
indices captured and the serving layer ids. Shards are the unit of resume and of work per rank.
Each shard and the index have their size and sha256 beside them (`<name>.sha256.json`, the shard
bytes themselves as they always were): a shard counts as done only when it is the file that was
written, and training checks every shard before it starts (`verify_shards`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..runtime.io import atomic_path, checksum_problem, verify_checksum, write_parquet
from . import merged

FIELDS = ("aux", "last", "input_ids", "loss_mask")
INDEX = "index.parquet"
META = "meta.json"


def shard_path(hidden_dir: Path | str, k: int) -> Path:
    return Path(hidden_dir) / f"shard-{k:05d}.safetensors"


def shard_number(path: Path) -> int:
    return int(path.stem.split("-")[1])


def shard_files(hidden_dir: Path | str) -> list[Path]:
    return sorted(Path(hidden_dir).glob("shard-*.safetensors"))


def plan_shards(merged_dir: Path, splits: list[str], shard_tokens: int) -> list[list[dict]]:
    """Consecutive merged samples grouped into shards of about `shard_tokens` tokens."""
    shards: list[list[dict]] = [[]]
    size = 0
    for split in splits:
        for row in merged.iter_rows(merged.split_path(merged_dir, split), ["sample_id", "length"]):
            if size and size + row["length"] > shard_tokens:
                shards.append([])
                size = 0
            shards[-1].append(dict(row, split=split))
            size += row["length"]
    return [s for s in shards if s]


def shard_rows(
    merged_dir: Path, plan: list[list[dict]], wanted: list[int]
) -> Iterator[tuple[int, list[dict]]]:
    """(k, rows of shard k) for each k in `wanted`, in order, from one pass over the split files.

    Shards are consecutive runs of the files' rows (plan_shards), so a rank streams the files once
    and keeps only its own shards' rows, one shard in memory at a time.
    """
    owner = {(r["split"], r["sample_id"]): k for k in wanted for r in plan[k]}
    splits = list(dict.fromkeys(r["split"] for k in wanted for r in plan[k]))
    current = -1  # the shard `rows` belong to; set before a row is kept
    rows: list[dict] = []
    for split in splits:
        for row in merged.iter_rows(
            merged.split_path(merged_dir, split), ["sample_id", "input_ids", "loss_spans"]
        ):
            k = owner.get((split, row["sample_id"]))
            if k is None:
                continue
            if k != current and rows:
                yield current, rows
                rows = []
            current = k
            rows.append(row)
    if rows:
        yield current, rows


def shard_key(fingerprint: str, shard: list[dict]) -> str:
    """Identity of a shard's content: the extraction settings and exactly which samples."""
    ids = "|".join(f"{r['split']}:{r['sample_id']}:{r['length']}" for r in shard)
    return hashlib.sha256(f"{fingerprint}|{ids}".encode()).hexdigest()[:16]


def shard_done(path: Path, key: str) -> bool:
    """A shard counts as done only when it exists, is the file that was written (size and
    sha256) and holds exactly the planned samples."""
    return shard_problem(path, key) is None


def shard_problem(path: Path, key: str) -> str | None:
    """Why the shard at `path` must be extracted (again): missing, not the file that was written
    (truncated, corrupted: a machine crash), or other samples or settings; None when it is done."""
    if not path.exists():
        return "missing"
    problem = checksum_problem(path)
    if problem:
        return problem
    try:
        with safe_open(str(path), "pt") as f:
            found = (f.metadata() or {}).get("shard_key")
    except Exception as err:  # safetensors' own error type: a header it cannot read
        return f"unreadable ({err})"
    return None if found == key else "written for other samples or settings"


def verify_shards(hidden_dir: Path | str, shards: list[int]) -> None:
    """Check that every shard in `shards` is the file extract wrote (size and sha256); a
    ChecksumError names the first that is not."""
    for k in shards:
        verify_checksum(shard_path(hidden_dir, k))


def loss_mask(rows: list[dict]) -> torch.Tensor:
    """The shard's loss_mask: its merged rows' loss_spans, concatenated."""
    return torch.cat([span_mask(len(r["input_ids"]), r["loss_spans"]) for r in rows])


def span_mask(length: int, spans: list[list[int]]) -> torch.Tensor:
    """1 at the positions of the [start, end) spans trained on (the target's own turns)."""
    mask = torch.zeros(length, dtype=torch.uint8)
    for start, end in spans:
        mask[start:end] = 1
    return mask


def write_index(hidden_dir: Path, plan: list[list[dict]]) -> int:
    """index.parquet for `plan`: where each sample's rows are; returns the number of samples."""
    index = []
    for k, shard in enumerate(plan):
        offset = 0
        for r in shard:
            index.append(
                dict(
                    sample_id=r["sample_id"],
                    split=r["split"],
                    shard=k,
                    offset=offset,
                    length=r["length"],
                )
            )
            offset += r["length"]
    write_parquet(pa.Table.from_pylist(index), Path(hidden_dir) / INDEX, checksum=True)
    return len(index)


class ShardWriter:
    """Writes shards on a background thread, one at a time, so the GPU never waits on the disk.
    `put` first waits for the previous write: that is what lets FeatureBuffers refill a set. A
    failed write is raised at the next put or at exit."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending: Future | None = None

    def put(self, tensors: dict[str, torch.Tensor], path: Path, metadata: dict) -> None:
        self.wait()
        self.pending = self.pool.submit(self._write, tensors, path, metadata)

    @staticmethod
    def _write(tensors: dict[str, torch.Tensor], path: Path, metadata: dict) -> None:
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        with atomic_path(path, size, checksum=True) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown()


class HiddenStates:
    """Samples of one split; each is a dict of aux [T, 3H], last [T, H], input_ids, loss_mask."""

    def __init__(self, directory: Path | str, split: str, max_length: int | None = None):
        self.directory = Path(directory)
        index_path = self.directory / INDEX
        if not index_path.exists():
            raise FileNotFoundError(f"{index_path}: no hidden-state index; run the extract stage")
        verify_checksum(index_path)
        index = pq.read_table(index_path).to_pylist()
        self.rows = [r for r in index if r["split"] == split]
        self.max_length = max_length
        self._files: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _shard(self, k: int):
        if k not in self._files:
            path = shard_path(self.directory, k)
            if not path.exists():
                raise FileNotFoundError(
                    f"{path}: listed in index.parquet but missing; rerun extract"
                )
            self._files[k] = safe_open(str(path), "pt")
        return self._files[k]

    def __getitem__(self, i: int) -> dict:
        r = self.rows[i]
        n = r["length"] if self.max_length is None else min(r["length"], self.max_length)
        shard = self._shard(r["shard"])
        return {f: shard.get_slice(f)[r["offset"] : r["offset"] + n] for f in FIELDS}


def collate(
    samples: list[dict], dtype: torch.dtype | None = torch.float32
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
