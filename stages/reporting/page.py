"""The HTML report: one self-contained file (inline CSS and SVG, no script, no external reference),
built from the values the report stage gathered.

Sections: the run at a glance (the compact metrics), the data per dataset (length histograms,
finish reasons and truncation, reasoning presence, tool-call integrity, budget used, failures),
sample records (reasoning, answer, tool calls and stop token apart, special tokens marked),
training (loss, replayed tau per evaluation, per-position acceptance), the benchmark (EAGLE-3's
and DFlash's tau side by side per dataset and temperature against plain decoding, each one's
per-position acceptance, at the width each verifies; a DFlash drafter not trained is said so, with
why, in their place) and serving (layer ids, launch commands).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from ..reports.benchmark import BenchmarkReport, Drafter, NotTrained
from ..reports.metrics import MetricsNotes, RunMetrics
from ..reports.train import TrainReport
from . import svg
from .card import ServingCommand
from .summary import unit

MEASURES = ("prompt", "reasoning", "answer")
KINDS = ("conditional", "unconditional")  # the benchmark's per-position acceptance
PART_LABELS = {
    "prompt": "prompt",
    "reasoning": "reasoning",
    "answer": "answer",
    "tool_calls": "tool calls",
    "stop": "stop token",
}


@dataclass(frozen=True)
class SampleView:
    """One generated turn, decoded: `prompt` and each part are (text, is_special) pieces."""

    sample_id: str
    dataset: str
    turn: int
    finish_reason: str
    facts: Mapping[str, object]  # lengths, tool calls...: shown in the header
    prompt: Sequence[tuple[str, bool]]
    parts: Sequence[tuple[str, int, Sequence[tuple[str, bool]]]]  # (kind, tokens, pieces)


@dataclass(frozen=True)
class Serving:
    """How the drafter is served: the layer ids each engine reads, and the commands the model
    card prints."""

    layer_ids: Mapping[str, list | None]  # engine (and config.json key) -> ids
    commands: Sequence[ServingCommand]
    card: str  # where the model card is


@dataclass(frozen=True)
class ReportData:
    title: str
    target: str
    metrics: RunMetrics
    notes: MetricsNotes  # why each null figure is null
    datasets: Sequence[str]
    answers: Mapping[str, list[dict]]  # the quality questions' rows, length_histogram included
    failures: list[dict]
    samples: Sequence[SampleView]
    train: TrainReport
    train_loss: list[dict]  # step, loss, ...
    train_evals: list[dict]  # step, replayed_tau, simulated_tau
    train_acceptance: list[dict]  # position, accuracy, conditional, unconditional
    benchmark: BenchmarkReport  # EAGLE-3's
    dflash: BenchmarkReport | NotTrained  # DFlash's, on the same prompts and temperatures
    serving: Serving
    max_chars: int = 4000  # per sample part


CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dde5; --bg:#fff; --soft:#f5f6f9; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; }
header.top { padding: 18px 28px 10px; border-bottom: 1px solid var(--line); }
header.top h1 { margin: 0 0 4px; font-size: 22px; }
header.top nav a { margin-right: 14px; color: #4269d0; text-decoration: none; }
main { padding: 8px 28px 40px; max-width: 1500px; }
h2 { margin: 28px 0 8px; font-size: 18px; border-bottom: 1px solid var(--line);
     padding-bottom: 4px; }
h3 { margin: 18px 0 6px; font-size: 15px; }
.muted { color: var(--muted); }
.tiles { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 8px; }
.tile { background: var(--soft); border: 1px solid var(--line); border-radius: 6px;
        padding: 8px 10px; }
.tile .v { font-size: 20px; font-weight: 600; }
.tile .k { font-size: 12px; color: var(--muted); overflow-wrap: break-word; }
.tile .why { font-size: 12px; color: var(--muted); font-style: italic; margin-top: 2px; }
.charts { display: flex; flex-wrap: wrap; gap: 10px 18px; }
svg.chart { font-size: 11px; background: #fff; }
svg.chart .chart-title { font-size: 12px; font-weight: 600; fill: var(--fg); }
svg.chart .grid { stroke: #eceef3; }
svg.chart .axis { stroke: #8a93a6; }
svg.chart .tick, svg.chart .legend, svg.chart .label { fill: var(--muted); }
svg.chart .reference { stroke: #1d2330; stroke-dasharray: 4 3; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 8px; text-align: right; }
th { background: var(--soft); font-weight: 600; }
td.text, th.text { text-align: left; }
td.error { text-align: left; color: #b3261e; font-family: ui-monospace, monospace; }
article.sample { border: 1px solid var(--line); border-radius: 6px; margin: 10px 0; }
article.sample > header { background: var(--soft); padding: 6px 10px; font-size: 13px; }
.part { border-left: 4px solid var(--line); margin: 6px 10px; padding: 2px 8px; }
.part .tag { font-size: 11px; font-weight: 600; text-transform: uppercase; letter-spacing: .04em; }
.part pre { margin: 2px 0 4px; white-space: pre-wrap; word-break: break-word; max-height: 320px;
            overflow: auto; font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.part.prompt { border-color: #9aa3b5; } .part.prompt .tag { color: #5b6475; }
.part.reasoning { border-color: #efb118; background: #fffaf0; }
.part.reasoning .tag { color: #9a6d00; }
.part.answer { border-color: #3ca951; background: #f3fbf5; } .part.answer .tag { color: #23753a; }
.part.tool_calls { border-color: #4269d0; background: #f2f5fd; }
.part.tool_calls .tag { color: #2c4a9e; }
.part.stop { border-color: #a463f2; } .part.stop .tag { color: #6f3bb5; }
span.special { background: #ebe3fb; color: #5b2a9e; border-radius: 3px; padding: 0 2px; }
code.cmd { display: block; background: var(--soft); border: 1px solid var(--line); padding: 6px 8px;
           white-space: pre-wrap; overflow-wrap: anywhere; font-size: 12px; }
"""


def _cell(value: object) -> str:
    if isinstance(value, float):
        return escape(f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}")
    if isinstance(value, int) and not isinstance(value, bool):
        return escape(f"{value:,}")
    return escape("-" if value is None else str(value))


def table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return '<p class="muted">(none)</p>'
    columns = list(columns or rows[0])
    head = "".join(
        f'<th class="{"text" if isinstance(rows[0].get(c), str) else ""}">{escape(c)}</th>'
        for c in columns
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"text" if isinstance(r.get(c), str) else ""}">{_cell(r.get(c))}</td>'
            for c in columns
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _charts(items: Sequence[str]) -> str:
    drawn = [c for c in items if c]
    return f'<div class="charts">{"".join(drawn)}</div>' if drawn else ""


def _by(rows: Sequence[Mapping], key: str = "dataset") -> dict[str, Mapping]:
    return {str(r[key]): r for r in rows}


def _glance(metrics: RunMetrics, notes: MetricsNotes) -> str:
    """One tile per figure: its value, its key and unit, and for a null figure why it is."""
    tiles = []
    for key, value in metrics.figures().items():
        shown = f"{value:.1%}" if key.endswith("_share") and isinstance(value, float) else None
        why = notes.why_null.get(key)
        tiles.append(
            f'<div class="tile"><div class="v">{escape(shown or _cell(value))}</div>'
            f'<div class="k">{breakable(key)}<br>{escape(unit(key))}</div>'
            + (f'<div class="why">{escape(why)}</div>' if why else "")
            + "</div>"
        )
    return f'<div class="tiles">{"".join(tiles)}</div>'


def breakable(key: str) -> str:
    """`key` escaped, with a line-break opportunity after each underscore: a metrics key holds
    no space, and a tile too narrow for it wraps it between its words, never inside one."""
    return "_<wbr>".join(escape(word) for word in key.split("_"))


def _data_overview(d: ReportData) -> str:
    names = list(d.datasets)
    fin = _by(d.answers.get("finish_reasons", []))
    rea = _by(d.answers.get("reasoning_presence", []))
    tools = _by(d.answers.get("tool_call_integrity", []))
    budget = _by(d.answers.get("budget_used", []))
    charts = [
        _share_chart(
            names,
            fin,
            {
                "stop": "stop_share",
                "length (truncated)": "truncated_share",
                "abort (failed)": "failed_share",
            },
            title="Finish reasons (share of replies)",
            stacked=True,
            y_max=1.0,
            name="finish-reasons",
        ),
        _share_chart(
            names,
            rea,
            {
                "opened": "reasoning_opened_share",
                "closed": "reasoning_closed_share",
                "empty": "empty_reasoning_share",
            },
            title="Reasoning presence (share of replies)",
            y_max=1.0,
            name="reasoning-presence",
        ),
        _share_chart(
            names,
            tools,
            {
                "tools offered": "tools_offered_share",
                "calls a tool": "tool_call_share",
                "call left open": "unbalanced_share",
            },
            title="Tool-call integrity (share of completed replies)",
            y_max=1.0,
            name="tool-calls",
        ),
        _share_chart(
            names,
            budget,
            {"budget used": "budget_used_share"},
            title="Token budget used (share)",
            name="budget-used",
        ),
    ]
    rows = [_overview_row(n, fin, rea, tools, budget) for n in names]
    return _charts(charts) + table(rows)


def _share_chart(
    names: Sequence[str],
    rows: Mapping[str, Mapping],
    columns: Mapping[str, str],
    **chart: Any,
) -> str:
    """Bars of shares per dataset, one series per label of `columns` (label -> column of
    `rows`); a dataset missing from `rows` gets no bar."""
    series = {label: [rows.get(n, {}).get(key) for n in names] for label, key in columns.items()}
    return svg.bars(names, series, x_label="dataset", y_label="share", **chart)


def _overview_row(
    n: str,
    fin: Mapping[str, Mapping],
    rea: Mapping[str, Mapping],
    tools: Mapping[str, Mapping],
    budget: Mapping[str, Mapping],
) -> dict:
    """One dataset's line of the overview table, from the four questions' rows."""
    return {
        "dataset": n,
        "replies": fin.get(n, {}).get("samples"),
        "stop": fin.get(n, {}).get("stop_share"),
        "truncated": fin.get(n, {}).get("truncated_share"),
        "failed": fin.get(n, {}).get("failed"),
        "reasoning closed": rea.get(n, {}).get("reasoning_closed_share"),
        "reasoning empty": rea.get(n, {}).get("empty_reasoning_share"),
        "calls a tool": tools.get(n, {}).get("tool_call_share"),
        "tool calls": tools.get(n, {}).get("tool_calls"),
        "calls left open": tools.get(n, {}).get("unbalanced_share"),
        "generated tokens": budget.get(n, {}).get("generated_tokens"),
        "budget tokens": budget.get(n, {}).get("budget_tokens"),
        "budget used": budget.get(n, {}).get("budget_used_share"),
    }


def buckets(rows: Sequence[Mapping]) -> list[dict]:
    """Histogram rows (bucket, bucket_start, samples) with the empty buckets between the first
    and the last filled in as zeros: the query returns only buckets that hold replies."""
    rows = sorted(rows, key=lambda r: r["bucket"])
    if len(rows) < 2:
        return [dict(r) for r in rows]
    first, last = rows[0], rows[-1]
    width = (last["bucket_start"] - first["bucket_start"]) / (last["bucket"] - first["bucket"])
    held = {r["bucket"]: r["samples"] for r in rows}
    return [
        {
            "bucket": b,
            "bucket_start": round(first["bucket_start"] + (b - first["bucket"]) * width),
            "samples": held.get(b, 0),
        }
        for b in range(first["bucket"], last["bucket"] + 1)
    ]


def _lengths(d: ReportData) -> str:
    hist = d.answers.get("length_histogram", [])
    dist = d.answers.get("length_distribution", [])
    out = []
    for n in d.datasets:
        charts = []
        for m in MEASURES:
            rows = buckets([r for r in hist if r["dataset"] == n and r["measure"] == m])
            if not rows:
                charts.append(f'<p class="muted">{escape(n)}: no {m} lengths (none closed)</p>')
                continue
            charts.append(
                svg.bars(
                    [svg.number(r["bucket_start"]) for r in rows],
                    {"replies": [r["samples"] for r in rows]},
                    title=f"{n}: {m} length",
                    x_label=f"{m} tokens (bucket start)",
                    y_label="replies",
                    width=340,
                    height=200,
                    name=f"hist-{n}-{m}",
                    scale=True,
                )
            )
        out.append(f"<h3>{escape(n)}</h3>" + _charts(charts))
        out.append(
            table(
                [r for r in dist if r["dataset"] == n],
                ["measure", "n", "min", "p5", "p50", "p95", "max", "mean"],
            )
        )
    return "".join(out)


def _pieces(pieces: Sequence[tuple[str, bool]], limit: int) -> str:
    out, used = [], 0
    for text, special in pieces:
        if used >= limit:
            break
        if not special and used + len(text) > limit:
            left = sum(len(t) for t, _ in pieces) - used - (limit - used)
            text = text[: limit - used] + f" … ({left:,} more characters)"
        used += len(text)
        out.append(f'<span class="special">{escape(text)}</span>' if special else escape(text))
    return "".join(out)


def _sample(s: SampleView, limit: int) -> str:
    facts = " · ".join(f"{escape(k)} {_cell(v)}" for k, v in s.facts.items())
    parts = [
        '<div class="part prompt"><span class="tag">prompt (decoded, end)</span>'
        f"<pre>{_pieces(s.prompt, limit)}</pre></div>"
    ]
    for kind, tokens, pieces in s.parts:
        parts.append(
            f'<div class="part {escape(kind)}"><span class="tag">'
            f"{escape(PART_LABELS.get(kind, kind))}</span> "
            f'<span class="muted">{tokens:,} token{"" if tokens == 1 else "s"}</span>'
            f"<pre>{_pieces(pieces, limit)}</pre></div>"
        )
    return (
        f'<article class="sample" id="sample-{escape(s.sample_id)}"><header>'
        f"<b>{escape(s.sample_id)}</b> · turn {s.turn} · finish {escape(s.finish_reason)} · "
        f"{facts}</header>{''.join(parts)}</article>"
    )


def _samples(d: ReportData) -> str:
    out = [
        '<p class="muted">Decoded from the stored ids with the target\'s tokenizer; '
        '<span class="special">special tokens</span> are shown where they sit. Parts are cut '
        "by token role: reasoning up to the end-of-reasoning token, the answer, tool-call "
        "sections, and the stop token.</p>"
    ]
    for n in d.datasets:
        mine = [s for s in d.samples if s.dataset == n]
        out.append(f"<h3>{escape(n)}</h3>")
        out += [_sample(s, d.max_chars) for s in mine] or ['<p class="muted">(none)</p>']
    return "".join(out)


def _training(d: ReportData) -> str:
    loss = [(float(r["step"]), float(r["loss"])) for r in d.train_loss if r.get("loss") is not None]
    charts = [
        svg.lines(
            {"loss": loss},
            title="Training loss",
            x_label="step",
            y_label="loss",
            name="train-loss",
        )
        if loss
        else "",
    ]
    evals = {
        key: [(float(r["step"]), float(r[key])) for r in d.train_evals if r.get(key) is not None]
        for key in ("replayed_tau", "simulated_tau")
    }
    if any(evals.values()):
        charts.append(
            svg.lines(
                evals,
                title="Acceptance length on the eval split",
                x_label="step",
                y_label="tau (tokens per step)",
                points=True,
                name="train-tau",
            )
        )
    acc = d.train_acceptance
    if acc:
        charts.append(
            svg.bars(
                [str(r["position"]) for r in acc],
                {k: [r.get(k) for r in acc] for k in ("accuracy", "conditional", "unconditional")},
                title="Per-position acceptance (best checkpoint)",
                x_label="draft position",
                y_label="share",
                y_max=1.0,
                name="train-acceptance",
            )
        )
    summary = [{"figure": k, "value": v} for k, v in d.train.to_json().items()]
    return _charts(charts) + table(summary) if summary or loss else '<p class="muted">(none)</p>'


def _benchmark(d: ReportData) -> str:
    """Each family's tau beside the other's per dataset and temperature, its per-position
    acceptance and its figures; a DFlash drafter not trained is said so, with why, and drawn
    nowhere."""
    said = f"<p>{escape(d.dflash.line)}</p>" if isinstance(d.dflash, NotTrained) else ""
    trained = [d.benchmark] if isinstance(d.dflash, NotTrained) else [d.benchmark, d.dflash]
    reports = {r.drafter: r for r in trained}
    if not any(r.temperatures for r in reports.values()):
        return said + '<p class="muted">(no benchmark)</p>'
    datasets = sorted(
        {n for r in reports.values() for t in r.temperatures.values() for n in t.datasets}
    )
    tau = {
        f"{name}, T = {t}": [v.datasets[n].tau if n in v.datasets else None for n in datasets]
        + [v.tau]
        for name, r in reports.items()
        for t, v in r.temperatures.items()
    }
    charts = [
        svg.bars(
            [*datasets, "all"],
            tau,
            title=f"tau per dataset, {' and '.join(reports)}, against plain decoding",
            x_label="dataset",
            y_label="tokens per verify step",
            reference=(1.0, "baseline 1.0"),
            name="benchmark-tau",
        )
    ]
    charts += [_per_position(name, r, kind) for name, r in reports.items() for kind in KINDS]
    widths = "; ".join(
        f"{name}: {r.tokens_verified_per_step} tokens verified per step ({r.mode} of "
        f"{r.num_steps} drafts), engine {r.engine}"
        for name, r in reports.items()
    )
    return (
        said
        + f'<p class="muted">{escape(widths)}. tau counts the tokens emitted per target verify '
        "step (plain decoding: 1.0); compare the two at equal width.</p>"
        + _charts(charts)
        + table(_benchmark_rows(reports))
    )


def _benchmark_rows(reports: Mapping[Drafter, BenchmarkReport]) -> list[dict]:
    """One row per family, temperature and dataset (and "all" of them)."""
    return [
        {
            "drafter": name,
            "tokens verified per step": r.tokens_verified_per_step,
            "temperature": t,
            "dataset": n,
            "prompts": a.prompts,
            "tau": a.tau,
            "conditional": " / ".join(
                "-" if x is None else f"{x:.2f}" for x in a.conditional or []
            ),
            "outputs equal baseline": a.outputs_equal_baseline,
        }
        for name, r in reports.items()
        for t, v in r.temperatures.items()
        for n, a in [*v.datasets.items(), ("all", v)]
    ]


def _per_position(name: str, r: BenchmarkReport, kind: str) -> str:
    """One family's acceptance per draft position, one series per temperature ("" if none)."""
    series = {f"T = {t}": list(getattr(v, kind) or []) for t, v in r.temperatures.items()}
    if not any(series.values()):
        return ""
    return svg.bars(
        [str(k + 1) for k in range(r.num_steps)],
        series,
        title=f"{name}: per-position acceptance, {kind}",
        x_label="draft position",
        y_label="share",
        y_max=1.0,
        name=f"benchmark-{name.lower()}-{kind}",
    )


def _serving(s: Serving) -> str:
    """The layer ids beside each other, then every command, with what to know before it."""
    rows = [{"engine": k, "layer ids": str(v)} for k, v in s.layer_ids.items()]
    out = [table(rows)]
    for c in s.commands:
        note = f'<p class="muted">{_inline_code(c.note)}</p>' if c.note else ""
        lines = "\n".join(c.lines)
        out.append(f'<h3>{escape(c.engine)}</h3>{note}<code class="cmd">{escape(lines)}</code>')
    out.append(f'<p class="muted">Model card: {escape(s.card)}</p>')
    return "".join(out)


def _inline_code(markdown: str) -> str:
    """A note's `code` spans (Markdown, as the model card holds them) as HTML."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escape(markdown))


def render(d: ReportData) -> str:
    sections = [
        ("glance", "Run at a glance", _glance(d.metrics, d.notes)),
        ("data", "Data per dataset", _data_overview(d)),
        ("lengths", "Length distributions", _lengths(d)),
        ("failures", "Failures", table(d.failures)),
        ("samples", "Sample records", _samples(d)),
        ("training", "Training", _training(d)),
        ("benchmark", "Benchmark", _benchmark(d)),
        ("serving", "Serving", _serving(d.serving)),
    ]
    nav = "".join(f'<a href="#{k}">{escape(t)}</a>' for k, t, _ in sections)
    body = "".join(
        f'<section id="{k}"><h2>{escape(t)}</h2>{html}</section>' for k, t, html in sections
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(d.title)}</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<style>{CSS}</style></head><body>"
        f'<header class="top"><h1>{escape(d.title)}</h1>'
        f'<div class="muted">target {escape(d.target)}</div><nav>{nav}</nav></header>'
        f"<main>{body}</main></body></html>\n"
    )
