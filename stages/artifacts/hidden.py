"""The hidden artifact: the target's features per merged sample, in resumable shards.

`<dir>/shard-NNNNN.safetensors` holds aux [T, num_aux * H], last [T, H], input_ids [T] and
loss_mask [T] for consecutive samples, with a `shard_key` in its metadata (the settings and the
exact samples: a shard counts as done only when its key matches); `index.parquet` says where each
sample is (sample_id, split, shard, offset, length); `meta.json` records the HF hidden-state
indices captured and the serving layer ids. Shards are the unit of resume and of work per rank.
Each shard and the index have their size and sha256 beside them (`<name>.sha256.json`, the shard
bytes themselves as they always were): a shard counts as done only when it is the file that was
written, and training checks every shard before it starts (`verify_shards`).

What is stored (`extract.store`, meta.json's `store`; absent: `all`):
- `all`: every row of every sample, as above.
- `supervised`: each sample's rows up to its last supervised token (the draft attends only to
  earlier positions, so later rows feed nothing the loss reads), and `last` only at the label
  positions (the next token is supervised: the target's distribution there is that token's
  label), compacted in position order; the index's `last_offset` says where a sample's label
  rows start in the shard's `last`. Read back, the other rows of `last` are zeros, which no loss
  term or metric reads (tests/capture/test_feature_store.py).
- `none` (online): the same rows of input_ids and loss_mask, no features: the train stage runs
  the target on each batch.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors import safe_open

from ..runtime.files import atomic_file, checksum_problem, verify_checksum, write_parquet
from ..runtime.tensor_file import save_safetensors
from . import merged

FEATURES = ("aux", "last")
STORES = ("all", "supervised", "none")
INDEX = "index.parquet"
META = "meta.json"


def shard_path(hidden_dir: Path | str, k: int) -> Path:
    return Path(hidden_dir) / f"shard-{k:05d}.safetensors"


def shard_number(path: Path) -> int:
    return int(path.stem.split("-")[1])


def shard_files(hidden_dir: Path | str) -> list[Path]:
    return sorted(Path(hidden_dir).glob("shard-*.safetensors"))


def plan_shards(
    merged_dir: Path, splits: list[str], shard_tokens: int, store: str = "all"
) -> list[list[dict]]:
    """Consecutive merged samples grouped into shards of about `shard_tokens` stored rows. Each
    sample's entry: sample_id, split, `length` (rows stored under `store`), `tokens` (the
    merged sample's) and `last_rows` (rows of `last` stored)."""
    shards: list[list[dict]] = [[]]
    size = 0
    columns = ["sample_id", "length", "loss_spans"]
    for split in splits:
        for row in merged.iter_rows(merged.split_path(merged_dir, split), columns):
            rows = stored_rows(row["length"], row["loss_spans"], store)
            if size and size + rows > shard_tokens:
                shards.append([])
                size = 0
            shards[-1].append(
                dict(
                    sample_id=row["sample_id"],
                    split=split,
                    length=rows,
                    tokens=row["length"],
                    last_rows=last_rows(rows, row["loss_spans"], store),
                )
            )
            size += rows
    return [s for s in shards if s]


def stored_rows(length: int, spans: list[list[int]], store: str) -> int:
    """Rows of a sample of `length` tokens a shard holds: all of them with store `all`, else up to
    its last supervised token (at least one row, so no sample is empty)."""
    if store == "all":
        return length
    return max(1, min(length, max((end for _, end in spans), default=0)))


def last_rows(rows: int, spans: list[list[int]], store: str) -> int:
    """Rows of `last` a sample of `rows` stored rows keeps under `store`."""
    if store == "supervised":
        return int(label_positions(span_mask(rows, spans)).sum())
    return rows if store == "all" else 0


def label_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """[T] bool: the positions of one sample whose `last` the loss reads, those whose next token
    is supervised (training-time test: a draft scored on token j + 1 learns the target's
    distribution at j)."""
    return torch.cat([loss_mask[1:].bool(), torch.zeros(1, dtype=torch.bool)])


def shard_rows(
    merged_dir: Path, plan: list[list[dict]], wanted: list[int]
) -> Iterator[tuple[int, list[dict]]]:
    """(k, rows of shard k) for each k in `wanted`, in order, from one pass over the split files.

    Shards are consecutive runs of the files' rows (plan_shards), so a rank streams the files once
    and keeps only its own shards' rows, one shard in memory at a time.
    """
    owner = {(r["split"], r["sample_id"]): (k, r["length"]) for k in wanted for r in plan[k]}
    splits = list(dict.fromkeys(r["split"] for k in wanted for r in plan[k]))
    current = -1  # the shard `rows` belong to; set before a row is kept
    rows: list[dict] = []
    for split in splits:
        for row in merged.iter_rows(
            merged.split_path(merged_dir, split), ["sample_id", "input_ids", "loss_spans"]
        ):
            planned = owner.get((split, row["sample_id"]))
            if planned is None:
                continue
            k, length = planned
            if k != current and rows:
                yield current, rows
                rows = []
            current = k
            rows.append(dict(row, input_ids=row["input_ids"][:length]))  # the rows stored
    if rows:
        yield current, rows


def shard_key(fingerprint: str, shard: list[dict]) -> str:
    """Identity of a shard's content: the extraction settings and exactly which samples."""
    ids = "|".join(f"{r['split']}:{r['sample_id']}:{r['length']}" for r in shard)
    return hashlib.sha256(f"{fingerprint}|{ids}".encode()).hexdigest()[:16]


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


def span_mask(length: int, spans: list[list[int]]) -> torch.Tensor:
    """1 at the positions of the [start, end) spans trained on (the target's own turns)."""
    mask = torch.zeros(length, dtype=torch.uint8)
    for start, end in spans:
        mask[start:end] = 1
    return mask


def shard_tensors(
    features: dict[str, torch.Tensor], rows: list[dict], store: str
) -> dict[str, torch.Tensor]:
    """What a shard holds under `store`, from its `rows` (shard_rows') and their captured
    `features` (aux, last and input_ids; input_ids alone with store `none`)."""
    masks = [span_mask(len(r["input_ids"]), r["loss_spans"]) for r in rows]
    tensors = {**features, "loss_mask": torch.cat(masks)}
    if store == "supervised":
        tensors["last"] = features["last"][torch.cat([label_positions(m) for m in masks])]
    return tensors


def storage(plan: list[list[dict]], aux_width: int, hidden: int, itemsize: int, store: str) -> dict:
    """Feature bytes the shards of `plan` hold under `store`, and per merged token against what
    `all` stores (input_ids and loss_mask, 5 bytes a row, not counted)."""
    samples = [r for shard in plan for r in shard]
    tokens = sum(r["tokens"] for r in samples)
    rows = sum(r["length"] for r in samples)
    last = sum(r["last_rows"] for r in samples)
    stored = 0 if store == "none" else (rows * aux_width + last * hidden) * itemsize
    return {
        "store": store,
        "bytes": stored,
        "bytes_per_token": round(stored / max(tokens, 1)),
        "bytes_per_token_all": (aux_width + hidden) * itemsize,
    }


def write_index(hidden_dir: Path, plan: list[list[dict]], store: str = "all") -> int:
    """index.parquet for `plan`: where each sample's rows are (with store `supervised`, its label
    rows too: `last_offset`); returns the number of samples."""
    index = []
    for k, shard in enumerate(plan):
        offset = last_offset = 0
        for r in shard:
            where = dict(offset=offset, length=r["length"])
            if store == "supervised":
                where["last_offset"] = last_offset
            index.append(dict(sample_id=r["sample_id"], split=r["split"], shard=k, **where))
            offset += r["length"]
            last_offset += r["last_rows"]
    write_parquet(pa.Table.from_pylist(index), Path(hidden_dir) / INDEX, checksum=True)
    return len(index)


@dataclass
class WriteTimes:
    """Seconds the writers spent writing and hashing shards (`save_s`) and syncing and renaming
    them (`seal_s`), summed over the writers; and seconds `put` waited for a free writer
    (`writer_wait_s`)."""

    save_s: float = 0.0
    seal_s: float = 0.0
    writer_wait_s: float = 0.0


class ShardWriter:
    """Writes shards on `workers` background threads, so the device never waits on the disk: at
    the extraction forward's rate at Llama-8B widths, features come faster than one thread
    serialising, syncing and hashing shard after shard keeps up with (docs/performance.md).
    `put` waits, while `workers` writes are in flight, for the oldest: a shard's buffers are free
    again once it and every shard put before it are written, the order in which FeatureBuffers
    hands its sets out again (workers + 2 sets: one filling, one landing). A failed write is
    raised at the next put or at exit."""

    def __init__(self, workers: int = 1):
        self.workers = workers
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shard-writer")
        self.pending: deque[Future] = deque()
        self.times = WriteTimes()
        self._lock = threading.Lock()

    def put(self, tensors: dict[str, torch.Tensor], path: Path, metadata: dict) -> None:
        clock = time.monotonic()
        while len(self.pending) >= self.workers:
            self.pending.popleft().result()
        failed = next((f for f in self.pending if f.done() and f.exception()), None)
        if failed is not None:
            self.pending.remove(failed)
            failed.result()
        self.times.writer_wait_s += time.monotonic() - clock
        self.pending.append(self.pool.submit(self._write, tensors, path, metadata))

    def _write(self, tensors: dict[str, torch.Tensor], path: Path, metadata: dict) -> None:
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        start = time.monotonic()
        with atomic_file(path, size) as out:
            save_safetensors(tensors, out, metadata)
            saved = time.monotonic()
        with self._lock:
            self.times.save_s += saved - start
            self.times.seal_s += time.monotonic() - saved

    def wait(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.wait()
        finally:
            self.pool.shutdown()


class HiddenStates:
    """Samples of one split; each is a dict of aux [T, layers x H] (the layers asked for, of those
    stored), last [T, H], input_ids, loss_mask (input_ids and loss_mask alone when the store is
    `none`)."""

    def __init__(
        self,
        directory: Path | str,
        split: str,
        max_length: int | None = None,
        layers: list[int] | None = None,
    ):
        """`layers`: the HF indices whose features `aux` gives, in this order, chosen from those
        stored (meta.json's aux_hf_indices); None: every stored layer."""
        self.directory = Path(directory)
        index_path = self.directory / INDEX
        if not index_path.exists():
            raise FileNotFoundError(f"{index_path}: no hidden-state index; run the extract stage")
        verify_checksum(index_path)
        index = pq.read_table(index_path).to_pylist()
        self.rows = [r for r in index if r["split"] == split]
        self.max_length = max_length
        meta = read_meta(self.directory)
        self.store = meta.store
        self.stored_layers = len(meta.aux_hf_indices)
        self.columns = _layer_columns(meta, layers, self.directory)
        self._files: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def lengths(self) -> list[int]:
        """Each sample's length as `__getitem__` gives it (cut to max_length), from the index."""
        cut = self.max_length
        return [r["length"] if cut is None else min(r["length"], cut) for r in self.rows]

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
        rows = slice(r["offset"], r["offset"] + n)
        sample = {f: shard.get_slice(f)[rows] for f in ("input_ids", "loss_mask")}
        if self.store == "none":
            return sample
        sample["aux"] = _select_layers(
            shard.get_slice("aux")[rows], self.columns, self.stored_layers
        )
        if self.store == "supervised":
            sample["last"] = _spread_labels(shard, r["last_offset"], sample["loss_mask"])
        else:
            sample["last"] = shard.get_slice("last")[rows]
        return sample


def _layer_columns(meta: HiddenMeta, layers: list[int] | None, directory: Path) -> list[int] | None:
    """Where each of `layers` lies among the stored ones; None when they are all of them, in
    order (aux is read as stored)."""
    stored = list(meta.aux_hf_indices)
    if layers is None or list(layers) == stored:
        return None
    missing = [i for i in layers if i not in stored]
    if missing:
        raise ValueError(
            f"{directory / META}: HF hidden states {missing} were not captured (stored: "
            f"{stored}); add the drafter to extract.drafters and rerun extract"
        )
    return [stored.index(i) for i in layers]


def _select_layers(aux: torch.Tensor, columns: list[int] | None, stored: int) -> torch.Tensor:
    """aux [T, stored * H] cut to the chosen layers, in their order: [T, len(columns) * H]."""
    if columns is None:
        return aux
    rows = aux.shape[0]
    return aux.view(rows, stored, -1)[:, columns].reshape(rows, -1)


def _spread_labels(shard, last_offset: int, loss_mask: torch.Tensor) -> torch.Tensor:
    """A sample's `last` [T, H] from its compacted label rows: each at its label position, zero
    rows elsewhere (no loss term or metric reads them)."""
    at = label_positions(loss_mask)
    labels = shard.get_slice("last")[last_offset : last_offset + int(at.sum())]
    last = labels.new_zeros(len(at), labels.shape[-1])
    last[at] = labels
    return last


@dataclass(frozen=True)
class HiddenMeta:
    """data/hidden/meta.json: what extract hands to train. The target and the HF hidden-state
    indices captured, the storage, and (engines other than hf) the engine, its SGLang release and
    the ids it captured with, and the facts that shape the shards. Keys that are null (or `store`
    all) are not written: the file of a run of the hf engine storing everything holds no key of
    the others."""

    fingerprint: str
    target_path: str
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    aux_hf_indices: list[int]
    dtype: str
    bytes_per_token: int
    engine: str | None = None
    sglang_version: str | None = None
    sglang_capture_ids: list[int] | None = None
    store: str = "all"
    bytes_per_token_all: int | None = None
    # the facts that shape the shards, which the fingerprint hashes: a rerun compares these
    # values, whatever formula hashed them (null: written before they were recorded)
    extracted_by: dict | None = None
    # the HF indices each drafter family reads, all among aux_hf_indices (null: written before
    # the families were recorded, when EAGLE-3 read every captured layer)
    drafter_layers: dict[str, list[int]] | None = None

    def layers_for(self, family: str) -> list[int] | None:
        """The HF indices `family` (eagle3, dflash) reads of the stored features, in its order;
        None when the features were not captured for it."""
        if self.drafter_layers is None:
            return list(self.aux_hf_indices) if family == "eagle3" else None
        return self.drafter_layers.get(family)

    def to_json(self) -> dict:
        written = asdict(self)
        if self.store == "all":
            del written["store"]
        return {k: v for k, v in written.items() if v is not None}


def read_meta(hidden_dir: Path) -> HiddenMeta:
    """The extraction's meta.json, or an error naming the file and what to run."""
    meta_path = hidden_dir / META
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path}: no hidden-state metadata; run the extract stage")
    raw = json.loads(meta_path.read_text())
    known = {f.name for f in fields(HiddenMeta)}
    try:
        return HiddenMeta(**{k: v for k, v in raw.items() if k in known})
    except TypeError as err:
        raise ValueError(
            f"{meta_path}: not the extract stage's metadata ({err}); run it again"
        ) from None


def collate(
    samples: list[dict], dtype: torch.dtype | None = torch.float32
) -> dict[str, torch.Tensor]:
    """Right-pad a list of samples into a batch with an attention mask; features (when the samples
    have them) in `dtype` (None: as stored)."""
    shape = (len(samples), max(s["input_ids"].shape[0] for s in samples))
    features = [f for f in FEATURES if f in samples[0]]
    batch = {
        f: torch.zeros(*shape, samples[0][f].shape[-1], dtype=dtype or samples[0][f].dtype)
        for f in features
    }
    batch["input_ids"] = torch.zeros(shape, dtype=torch.long)
    batch["loss_mask"] = torch.zeros(shape, dtype=torch.bool)
    batch["attention_mask"] = torch.zeros(shape, dtype=torch.bool)
    for b, s in enumerate(samples):
        n = s["input_ids"].shape[0]
        for f in features:
            batch[f][b, :n] = s[f].to(batch[f].dtype)
        batch["input_ids"][b, :n] = s["input_ids"].long()
        batch["loss_mask"][b, :n] = s["loss_mask"].bool()
        batch["attention_mask"][b, :n] = True
    return batch
