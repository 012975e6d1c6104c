"""The DuckDB SQL behind the merge and the quality report: one file per question."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # connected where used: the query console's --help loads no DuckDB
    import duckdb

QUERY_DIR = Path(__file__).parent


def sql(name: str) -> str:
    path = QUERY_DIR / f"{name}.sql"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such query")
    return path.read_text()


def file_list(paths: list[str]) -> str:
    """The SQL list literal of `paths`, for the views over raw parts (views take no parameters)."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


def open_samples(
    raw_files: list[str],
    *,
    memory_limit_gb: float | None = None,
    threads: int | None = None,
    spill_dir: Path | None = None,
) -> duckdb.DuckDBPyConnection:
    """A connection with the `samples` view over the given raw Parquet parts. With
    `memory_limit_gb`, DuckDB keeps its buffers under that many GB and its joins, sorts and
    windows write what does not fit to `spill_dir`; `threads`: its workers (None: every core)."""
    settings: dict[str, str | bool | int | float | list[str]] = {}
    if memory_limit_gb is not None:
        settings["memory_limit"] = f"{memory_limit_gb}GB"
    if threads is not None:
        settings["threads"] = threads
    if spill_dir is not None:
        settings["temp_directory"] = str(spill_dir)
    import duckdb

    con = duckdb.connect(config=settings)
    con.execute(sql("samples").replace("$raw_files", file_list(raw_files)))
    return con


def rows(con: duckdb.DuckDBPyConnection, name: str, **params) -> list[dict]:
    """Run query `name` with named parameters, returning rows as dicts."""
    text = sql(name)
    used = {k: v for k, v in params.items() if f"${k}" in text}
    cur = con.execute(text, used)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]
