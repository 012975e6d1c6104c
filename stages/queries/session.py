"""DuckDB by hand: the named questions (one `.sql` file each, described by its leading comment)
and a connection with every artifact already a view.

Views, each defined when its files exist: `prompts` (the prep outputs), `raw` (the raw parts as
stored), `samples` (the raw turns as every question reads them: one row per sample and turn,
with `total_tokens` and `prompt_key`), `merged` (both splits), `hidden_index` (the extraction's
index), and the table `budgets` (each dataset's token budget).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # connected where used: the query console's --help loads no DuckDB
    import duckdb

from . import QUERY_DIR, sql

PARAM = re.compile(r"\$([a-z_]+)")
_SENTENCE = re.compile(r"[.?](?=\s|$)")


def _literal(text: str) -> str:
    """`text` as an SQL string literal, for the view definitions (views take no parameters)."""
    return "'" + text.replace("'", "''") + "'"


def _files(paths: Sequence[str]) -> str:
    return "[" + ", ".join(_literal(p) for p in paths) + "]"


def description(name: str) -> str:
    """The question a query answers, in one line: its leading comment's first line, or, when
    that line runs on, the comment's first sentence."""
    lines = []
    for line in sql(name).splitlines():
        if not line.startswith("--"):
            break
        lines.append(line.lstrip("-").strip())
    if not lines:
        return ""
    if lines[0].endswith((".", "?", ")")):
        return lines[0]
    text = " ".join(lines)
    end = _SENTENCE.search(text)
    return text[: end.end()].strip() if end else text


def parameters(name: str) -> list[str]:
    """The named parameters ($name) the query takes, in order of first use."""
    return list(dict.fromkeys(PARAM.findall(sql(name))))


def is_view(name: str) -> bool:
    """A definition (CREATE ... VIEW) rather than a question."""
    body = "\n".join(x for x in sql(name).splitlines() if not x.startswith("--"))
    return body.lstrip().upper().startswith("CREATE")


def catalog() -> list[tuple[str, str]]:
    """(name, description) of every question, by name."""
    names = sorted(p.stem for p in QUERY_DIR.glob("*.sql"))
    return [(n, description(n)) for n in names if not is_view(n)]


def open_session(
    *,
    prompts: Sequence[str] = (),
    raw: Sequence[str] = (),
    merged: Sequence[str] = (),
    hidden_index: str | None = None,
    budgets: dict[str, int] | None = None,
) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """A connection with a view per artifact whose files are given; returns it and the names
    of the views defined."""
    import duckdb

    con = duckdb.connect()
    defined = []
    for view, paths in (("prompts", prompts), ("merged", merged)):
        if paths:
            con.execute(
                f"CREATE VIEW {view} AS SELECT * FROM read_parquet({_files(paths)}, "
                "union_by_name = true)"
            )
            defined.append(view)
    if raw:
        con.execute(
            f"CREATE VIEW raw AS SELECT * FROM read_parquet({_files(raw)}, union_by_name = true)"
        )
        con.execute(sql("samples").replace("$raw_files", _files(raw)))
        con.execute(sql("raw_ids").replace("$raw_files", _files(raw)))
        defined += ["raw", "samples", "raw_ids"]
    if hidden_index:
        con.execute(
            f"CREATE VIEW hidden_index AS SELECT * FROM read_parquet({_files([hidden_index])})"
        )
        defined.append("hidden_index")
    con.execute("CREATE TEMP TABLE budgets (dataset VARCHAR, budget_tokens BIGINT)")
    if budgets:
        con.executemany("INSERT INTO budgets VALUES (?, ?)", list(budgets.items()))
    defined.append("budgets")
    return con, defined


MERGE_PLAN = re.compile(r"\b(FROM|JOIN)\s+plan\b", re.IGNORECASE)


def add_plan(con: duckdb.DuckDBPyConnection, params: dict) -> None:
    """The merge's plan (merge.sql) as the temp table `plan` the merge's own questions read
    (merged_counts, misplaced_turns, merged_rows), with the merge's parameters in `params`."""
    text = sql("merge")
    con.execute(f"CREATE TEMP TABLE plan AS {text}", {k: params[k] for k in parameters("merge")})


def needs_plan(text: str) -> bool:
    return bool(MERGE_PLAN.search(text))


def keep_dataset(con: duckdb.DuckDBPyConnection, dataset: str) -> None:
    """Narrow every view and table with a `dataset` column to that dataset's rows, so that a
    question's ORDER BY ... LIMIT picks among them: filtering its answer would come after the
    LIMIT, and miss a dataset beyond the first rows. The whole of each stays as
    `<name>_all_datasets`. Build the merge's plan before: it dedupes across datasets."""
    found = con.execute(
        "SELECT t.table_name, t.table_type = 'VIEW' FROM information_schema.tables t "
        "JOIN information_schema.columns c USING (table_catalog, table_schema, table_name) "
        "WHERE c.column_name = 'dataset'"
    ).fetchall()
    kept = f"dataset = {_literal(dataset)}"
    for name, is_a_view in found:
        whole = f"{name}_all_datasets"
        con.execute(f'ALTER {"VIEW" if is_a_view else "TABLE"} "{name}" RENAME TO "{whole}"')
        con.execute(f'CREATE TEMP VIEW "{name}" AS SELECT * FROM "{whole}" WHERE {kept}')


def run(
    con: duckdb.DuckDBPyConnection, text: str, params: dict | None = None
) -> tuple[list[str], list[tuple]]:
    """Columns and rows of `text`, given the named parameters it uses."""
    used = {k: v for k, v in (params or {}).items() if f"${k}" in text}
    cur = con.execute(text, used)
    return [d[0] for d in cur.description], cur.fetchall()
