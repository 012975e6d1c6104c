"""`python -m stages.commands.query` (or `eagle-pipeline query`): DuckDB by hand over the current
artifacts.

    eagle-pipeline query                                   # the named questions, one line each
    eagle-pipeline query length_distribution --dataset sharegpt
    eagle-pipeline query longest_replies -p limit=5 --csv
    eagle-pipeline query --sql "SELECT split, count(*) FROM merged GROUP BY ALL"

Not a DVC stage. A named question is a file of stages/queries (the same SQL the merge, the
quality gate and the report run); `--sql` runs any SQL. Views already defined: `prompts`, `raw`,
`samples` (the raw turns as the questions read them), `merged`, `hidden_index`; table `budgets`.
Parameters a question takes ($name) default to params.yaml's values (`buckets`, `max_length`,
`seed`, `eval_fraction`) or to `limit` 20, `per_dataset` 3 and `split` train; `-p name=value`
sets one (a name the question does not take is an error naming those it does). The merge's own
questions (merged_counts, misplaced_turns, merged_rows) read the merge's plan, built for them
from the raw parts as the merge stage builds it. `--dataset D` narrows every view with a dataset
column (the plan too, once built from every dataset) to D's rows before the question runs, so a
`limit` counts D's rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..cli import StageError, run
from ..params.datasets import DatasetParams, read_datasets
from ..params.merge import MergeParams
from ..params.quality import QualityParams
from ..params.schema import PARAMS_FILE
from ..queries import sql
from ..queries.session import PARAM, catalog, parameters

if TYPE_CHECKING:  # connected where used: `eagle-pipeline --help` loads no DuckDB
    import duckdb


def defaults(params: Path, merged_dir: Path) -> dict:
    """Values for the parameters a question may name."""
    from ..artifacts.merged import split_path

    q = QualityParams.read(params)
    m = MergeParams.read(params)
    return {
        "limit": 20,
        "per_dataset": 3,
        "buckets": q.histogram_buckets,
        "max_length": m.max_length,
        "seed": str(m.seed),  # merge.sql hashes it as text, as the merge stage passes it
        "eval_fraction": m.eval_fraction,
        "split": "train",
        "train_file": str(split_path(merged_dir, "train")),
    }


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(
    question: Annotated[
        str | None, typer.Argument(help="a named question (none: list them)")
    ] = None,
    sql_text: Annotated[str | None, typer.Option("--sql", help="any SQL instead")] = None,
    dataset: Annotated[
        str | None, typer.Option(help="answer over this dataset's rows alone")
    ] = None,
    param: Annotated[list[str] | None, typer.Option("--param", "-p", help="name=value")] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV instead of a table")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table")] = False,
    data_dir: Annotated[Path, typer.Option(help="where the artifacts are")] = Path("data"),
    params: Annotated[Path, typer.Option(help="the params file")] = PARAMS_FILE,
) -> None:
    """List the named DuckDB questions, or answer one (or any SQL) over the current artifacts."""
    if question is None and sql_text is None:
        _list_questions()
        return
    text = _query_text(question, sql_text)
    datasets = read_datasets(params)
    if dataset is not None and dataset not in datasets:
        raise StageError(
            f"query: --dataset {dataset!r} is no dataset of {params}; its datasets: "
            f"{', '.join(datasets)}"
        )
    con, views = _open_views(data_dir, datasets)
    values = defaults(params, data_dir / "merged")
    values.update(_given_values(param or [], text, question))
    columns, rows = _answer(con, views, text, values, dataset)
    _print_result(columns, rows, as_json=as_json, as_csv=as_csv)


def _list_questions() -> None:
    """No question and no SQL: one line per named question, with the parameters it takes."""
    names = catalog()
    width = max(len(n) for n, _ in names)
    for name, text in names:
        takes = parameters(name)
        print(f"{name:<{width}}  {text}" + (f"  [{', '.join(takes)}]" if takes else ""))


def _query_text(question: str | None, sql_text: str | None) -> str:
    """The SQL to run: the named question's, or `--sql`'s; exactly one of them, not blank."""
    if question is not None and sql_text is not None:
        raise StageError("query: give a question's name or --sql, not both")
    if sql_text is not None and not sql_text.strip():
        raise StageError("query: --sql is empty; give the SQL to run, e.g. --sql 'FROM merged'")
    if question is None:
        return sql_text or ""
    try:
        return sql(question)
    except FileNotFoundError as err:
        known = ", ".join(n for n, _ in catalog())
        raise StageError(f"query: no question {question!r}; known: {known}") from err


def _open_views(
    data_dir: Path, datasets: dict[str, DatasetParams]
) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """A DuckDB session with a view for each artifact under `data_dir` that exists."""
    # imported here, not at the top: `eagle-pipeline --help` loads neither DuckDB nor torch
    from ..artifacts import hidden
    from ..artifacts.merged import SPLITS, split_path
    from ..artifacts.raw import parts
    from ..queries.session import open_session

    merged_dir = data_dir / "merged"
    index = data_dir / "hidden" / hidden.INDEX
    return open_session(
        prompts=[str(p) for p in sorted((data_dir / "prompts").glob("*.parquet"))],
        raw=[str(p) for n in datasets for p in parts(data_dir / "raw" / n)],
        merged=[
            str(split_path(merged_dir, s)) for s in SPLITS if split_path(merged_dir, s).exists()
        ],
        hidden_index=str(index) if index.exists() else None,
        budgets={n: d.generate.budget_tokens for n, d in datasets.items()},
    )


def _given_values(items: list[str], text: str, question: str | None) -> dict:
    """The `-p name=value` settings, each checked against the parameters `text` takes."""
    takes = list(dict.fromkeys(PARAM.findall(text)))
    given = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise StageError(f"query: --param {item!r}: expected name=value")
        if name not in takes:
            what = f"question {question}" if question else "this SQL"
            raise StageError(
                f"query: --param {name}: {what} takes "
                + (", ".join(takes) if takes else "no parameters")
            )
        given[name] = _value(value)
    return given


def _answer(
    con: duckdb.DuckDBPyConnection,
    views: list[str],
    text: str,
    values: dict,
    dataset: str | None,
) -> tuple[list[str], list[tuple]]:
    """Run `text` (over `dataset`'s rows alone, when given); a DuckDB error becomes one line
    naming the views the session defines."""
    import duckdb

    from ..queries.session import add_plan, keep_dataset, needs_plan
    from ..queries.session import run as run_sql

    try:
        if needs_plan(text):
            add_plan(con, values)
        if dataset is not None:
            keep_dataset(con, dataset)
        return run_sql(con, text, values)
    except duckdb.Error as err:  # a view that is not there, a typo in the SQL: its first line
        first = str(err).strip().splitlines()[0]
        raise StageError(f"query: {first} (views defined: {', '.join(views)})") from err


def _print_result(columns: list[str], rows: list[tuple], *, as_json: bool, as_csv: bool) -> None:
    """Print the answer as JSON, CSV or (by default) an aligned table."""
    from ..reporting.text import csv_text, json_text, text_table

    if as_json:
        print(json_text(columns, rows))
    elif as_csv:
        print(csv_text(columns, rows), end="")
    else:
        print(text_table(columns, rows))


if __name__ == "__main__":
    run(main)
