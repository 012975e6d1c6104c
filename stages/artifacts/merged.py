"""The merged artifact: `<dir>/{train,eval}.parquet`, one training sequence per row.

Columns: sample_id (unique per row), dataset, input_ids (list<int32>), loss_spans
(list<list<int32>>: the [start, end) of each of the target's turns in input_ids, the only
positions trained on), length, truncated, split. Written by DuckDB (stages/queries/merge.sql,
merged_rows.sql), zstd, in row groups of about ROW_GROUP_MB.

A sample generated with `regenerate: last_turn` or `all_turns` is one row: its generate sample id,
input_ids its last usable turn's prompt + output (which hold every earlier turn), one span per
turn. With `all_turns_rendered` each turn is one row, sample_id `<sample id>#<turn>`: input_ids
that turn's prompt + output, one span (its output); the sample's rows share a split.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

COLUMNS = ("sample_id", "dataset", "input_ids", "loss_spans", "length", "truncated", "split")
SPLITS = ("train", "eval")
# Uncompressed bytes per Parquet row group: its writer and every reader hold about one row group
# of a split at a time (by rows, DuckDB's default 122,880 sequences of 1,000 ids are 500 MB)
ROW_GROUP_MB = 64
# zstd level: token ids barely compress, and level 1 writes them much faster than the default 3
# for slightly more bytes (docs/performance.md, "Merge at scale")
ZSTD_LEVEL = 1
# Rows `iter_rows` turns into Python objects at a time. A whole row group at once (up to
# ROW_GROUP_MB of ids, some 16M tokens) keeps one core busy long enough that the extract stage
# queues no forward meanwhile; by 128 rows the first row comes at once (docs/performance.md)
ROWS_PER_BATCH = 128


def split_path(merged_dir: Path | str, split: str) -> Path:
    return Path(merged_dir) / f"{split}.parquet"


def iter_rows(path: Path | str, columns: list[str]) -> Iterator[dict]:
    """The rows of one split file, streamed in small record batches (a split can hold billions
    of tokens)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; run the merge stage")
    for batch in pq.ParquetFile(path).iter_batches(batch_size=ROWS_PER_BATCH, columns=columns):
        yield from batch.to_pylist()
