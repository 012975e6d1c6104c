"""A Hugging Face dataset, by id, saved as one local Parquet file that prep then reads.

    python -m stages.sources.hub glaiveai/glaive-function-calling-v2 \
        data/sources/glaive_fc.parquet --split train --revision <commit>

prep reads local files only, so that every input of a run is a file DVC hashes: download once
(online, with the `datasets` library: `pip install -e .[hub]`), pin the revision, and point
`datasets.<name>.prep.path` at the Parquet file. Any adapter reads it (Parquet is one of the
suffixes `read_rows` knows).
"""

from __future__ import annotations

from pathlib import Path

import typer

from ..runtime.files import atomic_path


def download(
    dataset_id: str,
    out: Path,
    split: str = "train",
    config: str | None = None,
    revision: str | None = None,
) -> int:
    """Save one split of a hub dataset to `out` (Parquet, written whole or not at all); its rows."""
    try:
        import datasets
    except ImportError:
        raise SystemExit(
            "reading a dataset by id needs the `datasets` library: "
            "pip install -e .[hub] (or pip install datasets)"
        ) from None
    data = datasets.load_dataset(dataset_id, config, split=split, revision=revision)
    with atomic_path(out) as tmp:
        data.to_parquet(str(tmp))
    return data.num_rows


def main(
    dataset_id: str,
    out: Path,
    split: str = "train",
    config: str | None = None,
    revision: str | None = None,
) -> None:
    """Download SPLIT of DATASET_ID from the Hugging Face hub to OUT (.parquet)."""
    if out.suffix != ".parquet":
        raise SystemExit(f"{out}: the output is written as Parquet; name it *.parquet")
    rows = download(dataset_id, out, split, config, revision)
    print(
        f"[hub] {dataset_id} ({config or 'default'}, {split}, revision {revision or 'latest'})"
        f": {rows:,} rows -> {out}"
    )


if __name__ == "__main__":
    typer.run(main)
