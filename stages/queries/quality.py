"""The quality questions: what the gate checks and the report shows, over the raw generations."""

from __future__ import annotations

from . import open_samples, rows

QUESTIONS = (
    "length_distribution",
    "reasoning_presence",
    "finish_reasons",
    "tool_call_integrity",
    "duplicates",
    "turns_per_sample",
    "budget_used",
)


def quality_answers(raw_files: list[str], budgets: dict[str, int], buckets: int) -> dict:
    """Every question's rows over the raw parts, with each dataset's token budget beside them."""
    con = open_samples(raw_files)
    con.execute("CREATE TEMP TABLE budgets (dataset VARCHAR, budget_tokens BIGINT)")
    con.executemany("INSERT INTO budgets VALUES (?, ?)", list(budgets.items()))
    result = {q: rows(con, q) for q in QUESTIONS}
    result["length_histogram"] = rows(con, "length_histogram", buckets=buckets)
    return result
