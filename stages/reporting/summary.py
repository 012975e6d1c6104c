"""The dozen figures a run is judged by, each key named with its unit, from the stages' detailed
reports: what `dvc metrics show` prints as one row and `dvc metrics diff` compares.

Units: `_samples` and `_tokens` are counts, `_share` a fraction in [0, 1] (the worst dataset's
where it says min or max), `_tokens_per_step` an acceptance length tau (tokens emitted per
target verify step), `_tokens_per_s` a throughput. A figure a run cannot give (no dataset that
expects tool calls, a stage that had nothing left to do) is null.
"""

from __future__ import annotations

from collections.abc import Mapping

UNITS = {
    "_samples": "samples",
    "_tokens": "tokens",
    "_share": "share (0-1)",
    "_tokens_per_step": "tokens per verify step (tau)",
    "_tokens_per_s": "tokens/s",
}


def tau_key(temperature: str) -> str:
    """`benchmark_tau_t0_tokens_per_step` for "0.0", `..._t0.7_...` for "0.7"."""
    t = float(temperature)
    label = str(int(t)) if t.is_integer() else f"{t:g}"
    return f"benchmark_tau_t{label}_tokens_per_step"


def _by_dataset(rows: list[dict]) -> dict[str, dict]:
    return {r["dataset"]: r for r in rows}


def _extreme(values: list, pick) -> float | None:
    found = [float(v) for v in values if v is not None]
    return round(pick(found), 4) if found else None


def run_metrics(
    *,
    generate: Mapping[str, dict],
    merge: dict,
    answers: Mapping[str, list[dict]],
    expect: Mapping[str, tuple[bool, bool]],
    vocab: dict,
    extract: dict,
    train: dict,
    benchmark: dict,
) -> dict:
    """`generate`: each dataset's generate report; `answers`: the quality questions' rows
    (reasoning_presence, finish_reasons, tool_call_integrity); `expect`: per dataset
    (reasoning expected, tool calls expected); the rest: those stages' reports."""
    reasoning = _by_dataset(answers["reasoning_presence"])
    finish = _by_dataset(answers["finish_reasons"])
    tools = _by_dataset(answers["tool_call_integrity"])
    train_split = merge.get("summary", {}).get("train", {})
    out: dict = {
        "generated_samples": sum(int(g.get("samples") or 0) for g in generate.values()),
        "generated_tokens": sum(int(g.get("tokens") or 0) for g in generate.values()),
        "train_supervised_tokens": train_split.get("supervised_tokens"),
        "reasoning_closed_min_share": _extreme(
            [reasoning.get(d, {}).get("reasoning_closed_share") for d, e in expect.items() if e[0]],
            min,
        ),
        "truncated_max_share": _extreme([r.get("truncated_share") for r in finish.values()], max),
        "tool_call_min_share": _extreme(
            [tools.get(d, {}).get("tool_call_share") for d, e in expect.items() if e[1]], min
        ),
        "vocab_coverage_share": vocab.get("coverage"),
        "replayed_tau_best_tokens_per_step": train.get("best_replayed_tau"),
    }
    for t, result in benchmark.get("temperatures", {}).items():
        out[tau_key(t)] = result.get("tau")
    out["extract_tokens_per_s"] = extract.get("tokens_per_s") or None
    out["train_tokens_per_s"] = train.get("tokens_per_s") or None
    out["train_padding_share"] = train.get("padding_share")
    # null when training read stored features; else the share of step time in the target
    out["train_target_forward_share"] = train.get("target_forward_share")
    return out


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
