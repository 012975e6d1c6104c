"""The dozen figures a run is judged by, each key named with its unit, from the stages' detailed
reports: what `dvc metrics show` prints as one row and `dvc metrics diff` compares
(reports/metrics.json, its record in stages/reports/metrics.py).

A dozen, because with DVCLive's three live figures that keeps `dvc metrics show` at 15 columns.
Each drafter family's tau is in it at T = 0 only (benchmark_tau_t0 for EAGLE-3, dflash_tau_t0):
greedy acceptance is the figure a drafter is quoted and compared by, and one key per family
keeps the row's width fixed whatever benchmark.temperatures lists, where one key per temperature
and family would grow it by two per temperature. The other temperatures' taus stay in the
benchmark reports (reports/benchmark.json, reports/benchmark_dflash.json), the report page and
the model card; where training's time went stays in reports/train.json (padding and
target-forward shares).

Units: `_samples` and `_tokens` are counts, `_share` a fraction in [0, 1] (the worst dataset's
where it says min or max), `_tokens_per_step` an acceptance length tau (tokens emitted per
target verify step), `_tokens_per_s` a throughput. A figure a run cannot give (no dataset that
expects tool calls, a stage that had nothing left to do, a DFlash drafter not trained) is null,
its reason in the notes beside the file (reports/metrics_notes.json).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from ..reports.benchmark import GREEDY, BenchmarkReport, NotTrained, greedy_tau
from ..reports.extract import ExtractReport
from ..reports.generate import GenerateReport
from ..reports.merge import MergeReport
from ..reports.metrics import MetricsNotes, RunMetrics
from ..reports.train import TrainReport
from ..reports.vocab import VocabReport

UNITS = {
    "_samples": "samples",
    "_tokens": "tokens",
    "_share": "share (0-1)",
    "_tokens_per_step": "tokens per verify step (tau)",
    "_tokens_per_s": "tokens/s",
}

V = TypeVar("V")


class NullReasons(dict[str, str]):
    """Why each null figure is null, said where the figure is worked out."""

    def unless(self, key: str, value: V | None, why: str) -> V | None:
        """`value`, recording `why` under `key` when it is None."""
        if value is None:
            self[key] = why
        return value


def _by_dataset(rows: list[dict]) -> dict[str, dict]:
    return {r["dataset"]: r for r in rows}


def _extreme(values: list, pick: Callable) -> float | None:
    found = [float(v) for v in values if v is not None]
    return round(pick(found), 4) if found else None


def _worst_expected(
    rows: Mapping[str, dict], column: str, expected: list[str], what: str
) -> tuple[float | None, str]:
    """The lowest `column` among the `expected` datasets, and why there is none."""
    if not expected:
        return None, f"not measured: no dataset expects {what} (datasets.<name>.expect)"
    value = _extreme([rows.get(d, {}).get(column) for d in expected], min)
    return value, f"not measured: no reply generated for {', '.join(expected)}"


def _reply_shares(
    answers: Mapping[str, list[dict]], expect: Mapping[str, tuple[bool, bool]], why: NullReasons
) -> tuple[float | None, float | None, float | None]:
    """The worst dataset's share of replies closing their reasoning (among those expecting
    reasoning), cut by the length limit, and calling a tool (among those expecting calls)."""
    closed = _worst_expected(
        _by_dataset(answers["reasoning_presence"]),
        "reasoning_closed_share",
        [d for d, e in expect.items() if e[0]],
        "reasoning",
    )
    calls = _worst_expected(
        _by_dataset(answers["tool_call_integrity"]),
        "tool_call_share",
        [d for d, e in expect.items() if e[1]],
        "tool calls",
    )
    truncated = _extreme([r.get("truncated_share") for r in answers["finish_reasons"]], max)
    return (
        why.unless("reasoning_closed_min_share", *closed),
        why.unless("truncated_max_share", truncated, "not measured: no reply generated"),
        why.unless("tool_call_min_share", *calls),
    )


def _tau_t0(report: BenchmarkReport, key: str, why: NullReasons) -> float | None:
    """A benchmark's tau at T = 0, or null with the reason."""
    measured = GREEDY in report.temperatures
    reason = "no verify step at temperature 0" if measured else "benchmark.temperatures has no 0.0"
    return why.unless(key, greedy_tau(report.temperatures), f"not measured: {reason}")


def _dflash_tau_t0(report: BenchmarkReport | NotTrained, why: NullReasons) -> float | None:
    """DFlash's tau at T = 0; null with the reason when no DFlash drafter was trained."""
    key = "dflash_tau_t0_tokens_per_step"
    if isinstance(report, NotTrained):
        return why.unless(key, None, f"not measured: {report.line}")
    return _tau_t0(report, key, why)


def run_metrics(
    *,
    generate: Mapping[str, GenerateReport],
    merge: MergeReport,
    answers: Mapping[str, list[dict]],
    expect: Mapping[str, tuple[bool, bool]],
    vocab: VocabReport,
    extract: ExtractReport,
    train: TrainReport,
    benchmark: BenchmarkReport,
    dflash: BenchmarkReport | NotTrained,
) -> tuple[RunMetrics, MetricsNotes]:
    """The figures and why each null one is null. `generate`: each dataset's generate report;
    `answers`: the quality questions' rows (reasoning_presence, finish_reasons,
    tool_call_integrity); `expect`: per dataset (reasoning expected, tool calls expected);
    `benchmark`, `dflash`: the EAGLE-3 and DFlash benchmarks (DFlash's: NotTrained where no drafter
    was trained); the rest: those stages' reports."""
    why = NullReasons()
    closed, truncated, calls = _reply_shares(answers, expect, why)
    metrics = RunMetrics(
        generated_samples=sum(g.samples for g in generate.values()),
        generated_tokens=sum(g.tokens for g in generate.values()),
        train_supervised_tokens=merge.summary.train.supervised_tokens,
        reasoning_closed_min_share=closed,
        truncated_max_share=truncated,
        tool_call_min_share=calls,
        vocab_coverage_share=vocab.coverage,
        replayed_tau_best_tokens_per_step=why.unless(
            "replayed_tau_best_tokens_per_step",
            train.best_replayed_tau,
            "not measured: training ran no evaluation (no eval samples, or train.eval_every "
            "past the last step)",
        ),
        benchmark_tau_t0_tokens_per_step=_tau_t0(
            benchmark, "benchmark_tau_t0_tokens_per_step", why
        ),
        dflash_tau_t0_tokens_per_step=_dflash_tau_t0(dflash, why),
        extract_tokens_per_s=why.unless(
            "extract_tokens_per_s",
            extract.tokens_per_s if extract.extracted_tokens else None,
            "not measured: this run extracted nothing (every shard was on disk already)",
        ),
        train_tokens_per_s=why.unless(
            "train_tokens_per_s",
            train.tokens_per_s or None,
            "not measured: this run took no step after its warm-up steps (timed apart)",
        ),
    )
    return metrics, MetricsNotes.of(metrics, why)


def unit(key: str) -> str:
    """The unit a metrics key names (its suffix)."""
    return next(
        (
            u
            for suffix, u in sorted(UNITS.items(), key=lambda s: -len(s[0]))
            if key.endswith(suffix)
        ),
        "",
    )
