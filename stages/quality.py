"""quality: DuckDB questions over the raw generations, and a gate before the expensive stages.

The questions count generated turns (one per sample, or every turn with regenerate: all_turns):
reasoning, truncation and tool calls are properties of each reply.

Reads params `quality` and `datasets` (what each dataset is expected to contain, and its budget).
Writes reports/quality.json (DVC metrics), reports/quality.md and reports/plots/lengths.csv; fails
with the dataset and the number when a threshold is not met, so a capture bug (reasoning lost,
tool calls cut, everything truncated) stops the run before extraction and training.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from .cli import PathOpt, StageError, run
from .params.datasets import ExpectParams, read_datasets
from .params.quality import QualityParams
from .params.schema import PARAMS_FILE
from .queries.quality import QUESTIONS, quality_answers
from .reports.prep import PrepReport
from .reports.quality import DatasetQuality, QualityReport
from .runtime.files import write_csv, write_text
from .runtime.outputs import remove_stale_temps_around
from .wiring.artifacts import raw_files

HISTOGRAM_COLUMNS = ["dataset", "measure", "bucket", "bucket_start", "samples"]


def answer(raw_dirs: dict[str, Path], budgets: dict[str, int], buckets: int) -> dict:
    """The quality questions over every dataset's verified raw parts."""
    return quality_answers(raw_files(raw_dirs.values(), "quality"), budgets, buckets)


@dataclass(frozen=True)
class Threshold:
    """One rule of the gate as data: the share it reads, its limit's params key and the words of
    its failure sit together, so a new rule cannot name the wrong key."""

    question: str  # the quality question whose per-dataset row holds the share
    what: str  # the failure's words for the share
    share: str  # the row's column
    key: str  # the QualityParams field holding the limit (quality.<key>)
    at_least: bool  # the limit is a minimum (else a maximum)
    expects: str | None = None  # the ExpectParams flag the rule needs (None: every dataset)

    def applies(self, row: dict, expect: ExpectParams) -> bool:
        """A share nobody expects, or one with no row, proves nothing about the capture."""
        return bool(row) and (self.expects is None or getattr(expect, self.expects))

    def missed(self, dataset: str, row: dict, q: QualityParams) -> str | None:
        """The failure, worded so the reader knows the dataset, the number and the key to change."""
        value, limit = row[self.share], getattr(q, self.key)
        if not ((value < limit) if self.at_least else (value > limit)):
            return None
        bound = "minimum" if self.at_least else "maximum"
        return (
            f"dataset {dataset}: {self.what} {value:.1%} ({bound} {limit:.0%}, quality.{self.key})"
        )


# In the order their failures are listed for a dataset.
THRESHOLDS = (
    Threshold("finish_reasons", "failed generations", "failed_share", "max_failed", False),
    Threshold(
        "finish_reasons",
        "truncated (finish_reason=length)",
        "truncated_share",
        "max_truncated",
        False,
    ),
    Threshold(
        "reasoning_presence",
        "reasoning closed in",
        "reasoning_closed_share",
        "min_reasoning_closed",
        True,
        expects="reasoning",
    ),
    Threshold(
        "reasoning_presence",
        "empty reasoning in",
        "empty_reasoning_share",
        "max_empty_reasoning",
        False,
        expects="reasoning",
    ),
    Threshold(
        "tool_call_integrity",
        "tool calls left open in",
        "unbalanced_share",
        "max_unbalanced_tool_calls",
        False,
    ),
    Threshold(
        "tool_call_integrity",
        "replies calling a tool",
        "tool_call_share",
        "min_tool_call_share",
        True,
        expects="tool_calls",
    ),
)


def rows_by_dataset(answers: dict, names: Iterable[str]) -> dict[str, dict[str, dict]]:
    """Each dataset's row of every gated question ({} where it has none): a rule reads one row,
    not a question's whole answer."""
    return {
        name: {
            k: {r["dataset"]: r for r in answers[k]}.get(name, {})
            for k in ("reasoning_presence", "finish_reasons", "tool_call_integrity")
        }
        for name in names
    }


def gate(answers: dict, expect: dict[str, ExpectParams], q: QualityParams) -> list[str]:
    """Every threshold a dataset misses: a sentence naming the dataset, the number and the key."""
    failures = []
    by = rows_by_dataset(answers, expect)
    for name, exp in expect.items():
        if not by[name]["finish_reasons"]:
            failures.append(f"dataset {name}: no generated samples")
            continue
        for rule in THRESHOLDS:
            row = by[name][rule.question]
            if rule.applies(row, exp) and (failure := rule.missed(name, row, q)):
                failures.append(failure)
    return failures


def metrics(
    answers: dict, prep_reports: dict[str, PrepReport], failures: list[str]
) -> QualityReport:
    """The flat per-dataset numbers DVC diffs between runs."""
    datasets = {}
    for name, prep in prep_reports.items():
        entry: dict[str, Any] = dict(prep_counts(prep))
        for q in (q for q in QUESTIONS if q != "length_distribution"):  # one row per dataset
            row: dict = next((r for r in answers[q] if r["dataset"] == name), {})
            entry.update({k: _plain(v) for k, v in row.items() if k != "dataset"})
        for r in answers["length_distribution"]:
            if r["dataset"] == name:
                entry[f"{r['measure']}_p50"] = _plain(r["p50"])
                entry[f"{r['measure']}_p95"] = _plain(r["p95"])
        datasets[name] = DatasetQuality(**entry)
    return QualityReport(gate_passed=not failures, datasets=datasets)


def prep_counts(prep: PrepReport) -> dict[str, int]:
    """What the quality report shows of a dataset's prep report."""
    return {
        "rows": prep.rows,
        "kept": prep.kept,
        "duplicate": prep.duplicate,
        "too_long": prep.too_long,
        "malformed": prep.malformed,
    }


def _plain(v):
    """JSON-friendly numbers: DuckDB sums come back as Decimal."""
    if isinstance(v, Decimal):
        v = int(v) if v == v.to_integral_value() else float(v)
    return round(v, 4) if isinstance(v, float) else v


def markdown(answers: dict, prep_reports: dict[str, PrepReport], failures: list[str]) -> str:
    lines = ["# Quality report", "", "Gate: **passed**" if not failures else "Gate: **FAILED**", ""]
    lines += [f"- {f}" for f in failures]
    lines += ["", "## Prompts (prep)", ""]
    lines += _table([{"dataset": k, **prep_counts(v)} for k, v in prep_reports.items()])
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
    params: Path = PARAMS_FILE,
) -> None:
    """Answer the quality questions and apply the gate."""
    q = QualityParams.read(params)
    datasets = read_datasets(params)
    remove_stale_temps_around(report, summary, plot)
    answers = answer(
        {n: raw_dir / n for n in datasets},
        {n: d.generate.budget_tokens for n, d in datasets.items()},
        q.histogram_buckets,
    )
    prep_reports = {
        n: PrepReport.read(prep_dir / f"{n}.json")
        for n in datasets
        if (prep_dir / f"{n}.json").exists()
    }
    failures = gate(answers, {n: d.expect for n, d in datasets.items()}, q)
    metrics(answers, prep_reports, failures).write(report)
    write_text(markdown(answers, prep_reports, failures), summary)
    write_csv(answers["length_histogram"], plot, HISTOGRAM_COLUMNS)
    if failures:
        raise StageError("quality gate failed:\n  " + "\n  ".join(failures) + f"\n(see {summary})")
    print(f"[quality] gate passed for {len(datasets)} datasets")


if __name__ == "__main__":
    run(main)
