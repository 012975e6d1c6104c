"""merge: every dataset's raw generations -> data/merged/{train,eval}.parquet.

Reads params `merge`. Dedupes prompts across datasets, joins prompt and output ids into
`input_ids` with `loss_start` (the first supervised position), splits eval by a seeded hash and
shuffles deterministically. DuckDB streams the Parquet files; nothing goes through Python lists.
"""
from __future__ import annotations

from pathlib import Path

from . import config
from .cli import StageError, run
from .io import atomic_path, write_json
from .queries import open_samples, sql
from .raw import parts


def merge(raw_dirs: list[Path], out_dir: Path, params: config.MergeParams) -> dict:
    files = [str(p) for d in raw_dirs for p in parts(d)]
    if not files:
        raise StageError(f"merge: no raw generations under {[str(d) for d in raw_dirs]}; "
                         f"run the generate stages first")
    con = open_samples(files)
    con.execute(f"CREATE TEMP TABLE merged AS {sql('merge')}",
                dict(max_length=params.max_length, seed=str(params.seed),
                     eval_fraction=params.eval_fraction))
    for split in ("train", "eval"):
        with atomic_path(out_dir / f"{split}.parquet") as tmp:
            con.execute(f"COPY (SELECT sample_id, dataset, input_ids, loss_start, length, truncated, "
                        f"split FROM merged WHERE NOT duplicate AND split = '{split}') "
                        f"TO '{tmp}' (FORMAT parquet, COMPRESSION zstd)")
    per = con.execute("""
        SELECT dataset, split, count(*) FILTER (WHERE NOT duplicate) AS samples,
               count(*) FILTER (WHERE duplicate) AS duplicates,
               sum(length) FILTER (WHERE NOT duplicate) AS tokens,
               sum(length - loss_start) FILTER (WHERE NOT duplicate) AS supervised_tokens,
               count(*) FILTER (WHERE truncated AND NOT duplicate) AS truncated
        FROM merged GROUP BY ALL ORDER BY ALL""").fetchall()
    totals: dict = {"train": {}, "eval": {}}
    for dataset, split, samples, dups, tokens, supervised, truncated in per:
        totals[split][dataset] = dict(samples=samples, duplicates=dups, tokens=int(tokens or 0),
                                      supervised_tokens=int(supervised or 0), truncated=truncated)
    summary = {split: {k: sum(d[k] for d in by.values())
                       for k in ("samples", "duplicates", "tokens", "supervised_tokens")}
               for split, by in totals.items()}
    if not summary["train"]["samples"]:
        raise StageError("merge: the train split is empty; lower merge.eval_fraction or "
                         "generate more samples")
    return {"summary": summary, "per_dataset": totals}


def main(params: Path = config.PARAMS_FILE, raw_dir: Path = Path("data/raw"),
         out_dir: Path = Path("data/merged"), report: Path = Path("reports/merge.json")) -> None:
    """Merge, dedupe, shuffle and split all generated datasets."""
    merge_params = config.section(config.MergeParams, "merge", params)
    names = sorted(config.datasets(params))
    metrics = merge([raw_dir / n for n in names], out_dir, merge_params)
    write_json(metrics, report)
    print(f"[merge] {metrics['summary']}")


if __name__ == "__main__":
    run(main)
