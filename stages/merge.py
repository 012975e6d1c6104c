"""merge: every dataset's raw generations -> data/merged/{train,eval}.parquet.

Reads params `merge`. One training sequence per sample: `input_ids` are its last usable turn's
prompt and output (which hold every turn before it, id for id) and `loss_spans` the [start, end)
of each turn's output, the positions trained on. Turns generated with `regenerate:
all_turns_rendered` (the raw rows' `regenerate`) are one sequence each, `<sample_id>#<turn>`:
their prompt is the template's rendering, not the sequence before them. Dedupes prompts across
datasets, splits eval by a seeded hash of the sample (all its sequences on one side) and shuffles
deterministically. DuckDB streams the Parquet files; nothing goes through Python lists.

In bounded memory (`merge.memory_limit_gb`, whatever the data's size): the plan (which rows,
split, order, spans) is built without reading a token id, and each split's ids are then read
from the raw parts by file and row and sorted into place, DuckDB writing what does not fit to a
temporary folder inside the output folder (removed when the merge ends).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb

from .artifacts import merged
from .cli import PathOpt, StageError, run
from .params.datasets import read_datasets
from .params.merge import MergeParams
from .params.schema import PARAMS_FILE
from .queries import file_list, open_samples, rows, sql
from .reports.merge import MergeCounts, MergeReport, SplitsByDataset, SplitTotals
from .runtime.files import atomic_path, temp_path
from .runtime.outputs import output_lock, remove_stale_temps_around
from .wiring.artifacts import raw_files

COUNTS = (
    "samples",  # training sequences
    "conversations",  # the samples of generate they come from
    "duplicates",
    "tokens",
    "supervised_tokens",
    "turns",
    "truncated",
    "shortened",
)


def merge(raw_dirs: list[Path], out_dir: Path, params: MergeParams) -> MergeReport:
    files = raw_files(raw_dirs, "merge")
    spill_dir = temp_path(out_dir / "spill", os.getpid())  # removed by a rerun if killed
    spill_dir.mkdir(parents=True, exist_ok=True)
    try:
        with open_samples(
            files,
            memory_limit_gb=params.memory_limit_gb,
            threads=params.threads or len(os.sched_getaffinity(0)),
            spill_dir=spill_dir,
        ) as con:
            per = run_queries(con, files, out_dir, params)
    except duckdb.OutOfMemoryException as err:
        raise StageError(
            f"merge: {str(err).splitlines()[0]} (merge.memory_limit_gb: "
            f"{params.memory_limit_gb}); raise merge.memory_limit_gb in params.yaml"
        ) from None
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    totals: dict[str, dict[str, MergeCounts]] = {"train": {}, "eval": {}}
    for r in per:
        totals[r["split"]][r["dataset"]] = MergeCounts(**{k: int(r[k] or 0) for k in COUNTS})
    by_dataset = SplitsByDataset(**totals)
    summary = SplitTotals(
        train=MergeCounts.total(by_dataset.train.values()),
        eval=MergeCounts.total(by_dataset.eval.values()),
    )
    if not summary.train.samples:
        raise StageError(
            "merge: the train split is empty; lower merge.eval_fraction or generate more samples"
        )
    return MergeReport(summary=summary, per_dataset=by_dataset)


def run_queries(
    con: duckdb.DuckDBPyConnection, files: list[str], out_dir: Path, params: MergeParams
) -> list[dict]:
    """The plan, its checks and both split files, over `con`; the counts per dataset and split."""
    con.execute(sql("raw_ids").replace("$raw_files", file_list(files)))
    con.execute(
        f"CREATE TEMP TABLE plan AS {sql('merge')}",
        dict(
            max_length=params.max_length, seed=str(params.seed), eval_fraction=params.eval_fraction
        ),
    )
    misplaced = rows(con, "misplaced_turns")
    if misplaced:
        where = ", ".join(f"{r['sample_id']} turn {r['turn']}" for r in misplaced)
        raise StageError(
            f"merge: turns whose ids are not the start of their sample's later "
            f"turns ({where}): the raw data mixes runs; delete data/raw/"
            f"{misplaced[0]['dataset']} and generate it again"
        )
    # One thread writes: with two, sorted row groups wait in memory for the writer to take them
    # in order, which broke the memory limit (docs/performance.md, the merge at 1.1B tokens)
    con.execute("SET threads = 1")
    for split in merged.SPLITS:
        with atomic_path(merged.split_path(out_dir, split)) as tmp:
            try:
                con.execute(
                    f"COPY (SELECT {', '.join(merged.COLUMNS)} FROM ({sql('merged_rows')}) "
                    f"ORDER BY position) TO '{tmp}' (FORMAT parquet, COMPRESSION zstd, "
                    f"COMPRESSION_LEVEL {merged.ZSTD_LEVEL}, "
                    f"ROW_GROUP_SIZE_BYTES '{merged.ROW_GROUP_MB}MB')",
                    dict(max_length=params.max_length, split=split),
                )
            except duckdb.InvalidInputException as err:  # merged_rows.sql's error()
                raise StageError(
                    f"merge: {str(err).removeprefix('Invalid Input Error: ')}; the raw data is "
                    f"damaged or not generate's: delete that dataset's data/raw/<dataset> and "
                    f"generate it again"
                ) from None
    return rows(con, "merged_counts")


def main(raw: PathOpt, out: PathOpt, report: PathOpt, params: Path = PARAMS_FILE) -> None:
    """Merge, dedupe, shuffle and split all generated datasets (raw dir -> merged dir)."""
    merge_params = MergeParams.read(params)
    names = sorted(read_datasets(params))
    with output_lock(out, "merge"):
        remove_stale_temps_around(out, report)
        metrics = merge([raw / n for n in names], out, merge_params)
        metrics.write(report)
    print(f"[merge] {metrics.to_json()['summary']}")


if __name__ == "__main__":
    run(main)
