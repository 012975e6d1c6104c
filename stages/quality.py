"""quality: DuckDB questions over the raw generations, and a gate before the expensive stages.

The questions count generated turns (one per sample, or every turn with regenerate: all_turns):
reasoning, truncation and tool calls are properties of each reply.

Reads params `quality` and `datasets` (what each dataset is expected to contain, and its budget).
Writes reports/quality.json (DVC metrics), reports/quality.md and reports/plots/lengths.csv; fails
with the dataset and the number when a threshold is not met, so a capture bug (reasoning lost,
tool calls cut, everything truncated) stops the run before extraction and training.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from . import config
from .cli import PathOpt, StageError, run
from .queries.quality import QUESTIONS, quality_answers
from .runtime.files import write_csv, write_json, write_text
from .runtime.outputs import remove_stale_temps_around
from .wiring.artifacts import raw_files

HISTOGRAM_COLUMNS = ["dataset", "measure", "bucket", "bucket_start", "samples"]


def answer(raw_dirs: dict[str, Path], budgets: dict[str, int], buckets: int) -> dict:
    """The quality questions over every dataset's verified raw parts."""
    return quality_answers(raw_files(raw_dirs.values(), "quality"), budgets, buckets)


def gate(
    answers: dict, expect: dict[str, config.ExpectParams], q: config.QualityParams
) -> list[str]:
    """Every threshold a dataset misses: a sentence naming the dataset, the number and the key."""
    failures = []

    def check(dataset: str, what: str, value: float, limit: float, key: str, at_least: bool):
        if (value < limit) if at_least else (value > limit):
            bound = "minimum" if at_least else "maximum"
            failures.append(
                f"dataset {dataset}: {what} {value:.1%} ({bound} {limit:.0%}, quality.{key})"
            )

    by = {
        name: {
            k: {r["dataset"]: r for r in answers[k]}.get(name, {})
            for k in ("reasoning_presence", "finish_reasons", "tool_call_integrity")
        }
        for name in expect
    }
    for name, exp in expect.items():
        fin = by[name]["finish_reasons"]
        if not fin:
            failures.append(f"dataset {name}: no generated samples")
            continue
        check(name, "failed generations", fin["failed_share"], q.max_failed, "max_failed", False)
        check(
            name,
            "truncated (finish_reason=length)",
            fin["truncated_share"],
            q.max_truncated,
            "max_truncated",
            False,
        )
        rea = by[name]["reasoning_presence"]
        if exp.reasoning and rea:
            check(
                name,
                "reasoning closed in",
                rea["reasoning_closed_share"],
                q.min_reasoning_closed,
                "min_reasoning_closed",
                True,
            )
            check(
                name,
                "empty reasoning in",
                rea["empty_reasoning_share"],
                q.max_empty_reasoning,
                "max_empty_reasoning",
                False,
            )
        tools = by[name]["tool_call_integrity"]
        if tools:
            check(
                name,
                "tool calls left open in",
                tools["unbalanced_share"],
                q.max_unbalanced_tool_calls,
                "max_unbalanced_tool_calls",
                False,
            )
            if exp.tool_calls:
                check(
                    name,
                    "replies calling a tool",
                    tools["tool_call_share"],
                    q.min_tool_call_share,
                    "min_tool_call_share",
                    True,
                )
    return failures


def metrics(answers: dict, prep_reports: dict[str, dict], failures: list[str]) -> dict:
    """The flat per-dataset numbers DVC diffs between runs."""
    out: dict = {"gate_passed": not failures, "datasets": {}}
    for name, prep in prep_reports.items():
        entry = {k: prep.get(k) for k in ("rows", "kept", "duplicate", "too_long", "malformed")}
        for q in (q for q in QUESTIONS if q != "length_distribution"):  # one row per dataset
            row: dict = next((r for r in answers[q] if r["dataset"] == name), {})
            entry.update({k: _plain(v) for k, v in row.items() if k != "dataset"})
        for r in answers["length_distribution"]:
            if r["dataset"] == name:
                entry[f"{r['measure']}_p50"] = _plain(r["p50"])
                entry[f"{r['measure']}_p95"] = _plain(r["p95"])
        out["datasets"][name] = entry
    return out


def _plain(v):
    """JSON-friendly numbers: DuckDB sums come back as Decimal."""
    if isinstance(v, Decimal):
        v = int(v) if v == v.to_integral_value() else float(v)
    return round(v, 4) if isinstance(v, float) else v


def markdown(answers: dict, prep_reports: dict, failures: list[str]) -> str:
    lines = ["# Quality report", "", "Gate: **passed**" if not failures else "Gate: **FAILED**", ""]
    lines += [f"- {f}" for f in failures]
    lines += ["", "## Prompts (prep)", ""]
    lines += _table(
        [
            {
                "dataset": k,
                **{c: v.get(c) for c in ("rows", "kept", "duplicate", "too_long", "malformed")},
            }
            for k, v in prep_reports.items()
        ]
    )
    titles = {
        "length_distribution": "Length distributions (tokens)",
        "reasoning_presence": "Reasoning presence",
        "finish_reasons": "Finish reasons",
        "tool_call_integrity": "Tool-call integrity",
        "duplicates": "Duplicate prompts",
        "turns_per_sample": "Turns per sample",
        "budget_used": "Token budget used",
    }
    for q, title in titles.items():
        lines += ["", f"## {title}", ""] + _table(answers[q])
    return "\n".join(lines) + "\n"


def _table(records: list[dict]) -> list[str]:
    if not records:
        return ["(none)"]
    cols = list(records[0])
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + [
        "| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in records
    ]


def main(
    raw_dir: PathOpt,
    prep_dir: PathOpt,
    report: PathOpt,
    summary: PathOpt,
    plot: PathOpt,
    params: Path = config.PARAMS_FILE,
) -> None:
    """Answer the quality questions and apply the gate."""
    q = config.section(config.QualityParams, "quality", params)
    datasets = config.datasets(params)
    remove_stale_temps_around(report, summary, plot)
    answers = answer(
        {n: raw_dir / n for n in datasets},
        {n: d.generate.budget_tokens for n, d in datasets.items()},
        q.histogram_buckets,
    )
    prep_reports = {
        n: json.loads((prep_dir / f"{n}.json").read_text())
        for n in datasets
        if (prep_dir / f"{n}.json").exists()
    }
    failures = gate(answers, {n: d.expect for n, d in datasets.items()}, q)
    write_json(metrics(answers, prep_reports, failures), report)
    write_text(markdown(answers, prep_reports, failures), summary)
    write_csv(answers["length_histogram"], plot, HISTOGRAM_COLUMNS)
    if failures:
        raise StageError("quality gate failed:\n  " + "\n  ".join(failures) + f"\n(see {summary})")
    print(f"[quality] gate passed for {len(datasets)} datasets")


if __name__ == "__main__":
    run(main)
