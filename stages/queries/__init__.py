"""The DuckDB SQL behind the merge and the quality report: one file per question."""

from __future__ import annotations

from pathlib import Path

import duckdb

QUERY_DIR = Path(__file__).parent


def sql(name: str) -> str:
    path = QUERY_DIR / f"{name}.sql"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such query")
    return path.read_text()


def open_samples(raw_files: list[str]) -> duckdb.DuckDBPyConnection:
    """A connection with the `samples` view over the given raw Parquet parts."""
    con = duckdb.connect()
    files = "[" + ", ".join("'" + f.replace("'", "''") + "'" for f in raw_files) + "]"
    con.execute(sql("samples").replace("$raw_files", files))  # views take no parameters
    return con


def rows(con: duckdb.DuckDBPyConnection, name: str, **params) -> list[dict]:
    """Run query `name` with named parameters, returning rows as dicts."""
    text = sql(name)
    used = {k: v for k, v in params.items() if f"${k}" in text}
    cur = con.execute(text, used)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]
