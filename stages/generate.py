"""generate@<dataset>: prompt ids -> the target's raw output ids, resumable, within a token budget.

Reads params `target`, `generate` and `datasets.<name>.generate`. Output data/raw/<name>/ persists
across runs: turns already generated under the same fingerprint (model, template, sampling,
regenerate mode) are skipped and conversations continue where they stopped; a changed
fingerprint starts the dataset over. With `regenerate: all_turns_rendered` each later turn's
prompt is rendered by the chat template from the conversation so far (target/history.py).
Writes reports/generate/<name>.json.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from . import config
from .artifacts.prompts import read_prompts
from .artifacts.raw import (
    RAW_SCHEMA,
    append_part,
    compact,
    drop_corrupt_parts,
    last_turns,
    read_raw,
)
from .cli import PathOpt, StageError, run, summary
from .engines import AuthError, Completion, EngineError, Sampling
from .engines.turns import Output, RenderPrompt, TurnQueue
from .runtime.files import write_json
from .runtime.outputs import empty_dir, output_lock, remove_stale_temps, remove_stale_temps_around
from .serving.monitor import Backlog, GenerationMonitor, run_backlog
from .target.history import HistoryRenderer
from .target.tokens import TokenRoles, analyze_output
from .wiring.engines import make_engine, sampling_for
from .wiring.target import target_fingerprint, target_roles, target_tokenizer


def fingerprint(target: config.TargetParams, sampling: Sampling, regenerate: str) -> str:
    """Everything that shapes the generated tokens; a change regenerates the dataset."""
    payload = json.dumps(
        [target_fingerprint(target), sampling.__dict__, regenerate], sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def history_renderer(renderer: HistoryRenderer) -> RenderPrompt:
    """The turn queue's callback for all_turns_rendered: a prompts row's message segments and
    tools (JSON columns) and the turns so far -> the next turn's rendered prompt."""

    def render(row: dict, outputs: list[Output]) -> list[int]:
        segments = [json.loads(s) for s in row["turn_messages"][: len(outputs) + 1]]
        tools = json.loads(row["tools"]) if row["tools"] else None
        return renderer.prompt(segments, tools, outputs)

    return render


def completion_row(
    prompt: dict, done: Completion, roles: TokenRoles, engine: str, fp: str, tokenizer
) -> dict:
    anatomy = analyze_output(done.output_ids, roles, prompt["reasoning_open"])
    return dict(
        prompt,
        output_ids=done.output_ids,
        finish_reason=done.finish_reason,
        completion_tokens=len(done.output_ids),
        reasoning_tokens=anatomy.reasoning_tokens,
        answer_tokens=anatomy.answer_tokens,
        tool_calls=anatomy.tool_calls,
        tool_calls_balanced=anatomy.tool_calls_balanced,
        error=done.error,
        latency_s=done.latency_s,
        engine=engine,
        fingerprint=fp,
        output_text=tokenizer.decode(done.output_ids, skip_special_tokens=False),
    )


def generate_dataset(
    name: str,
    prompts_path: Path,
    out_dir: Path,
    gen: config.GenerateParams,
    budget_tokens: int,
    target: config.TargetParams,
    engine=None,
    others: Sequence[Backlog] = (),
) -> dict:
    """Generate into `out_dir`, holding its lock: a second generation into the same folder is
    refused. A server that refuses the API key fails naming generate.sglang.api_key_env."""
    with output_lock(out_dir, f"generate {name}"):
        try:
            return _generate_dataset(
                name, prompts_path, out_dir, gen, budget_tokens, target, engine, others
            )
        except AuthError as err:
            raise StageError(f"generate.sglang.api_key_env: {err}") from None


def _generate_dataset(
    name: str,
    prompts_path: Path,
    out_dir: Path,
    gen: config.GenerateParams,
    budget_tokens: int,
    target: config.TargetParams,
    engine,
    others: Sequence[Backlog],
) -> dict:
    tokenizer = target_tokenizer(target)
    roles = target_roles(target, tokenizer)
    sampling = sampling_for(gen, roles)
    prompts, settings = read_prompts(prompts_path)
    fp = fingerprint(target, sampling, settings.regenerate)

    remove_stale_temps(out_dir)
    for part, problem in drop_corrupt_parts(out_dir):
        print(f"[generate {name}] {part}: {problem}; removed, its turns are generated again")
    existing = read_raw(out_dir)
    found = sorted(set(existing.column("fingerprint").to_pylist()))
    if existing.num_rows and found != [fp]:
        print(
            f"[generate {name}] the raw data in {out_dir} was generated under fingerprint(s) "
            f"{', '.join(map(str, found))}, this run's is {fp}: the model, template, sampling or "
            f"regenerate mode changed, so {name} is generated again from the start"
        )
        empty_dir(out_dir)
        existing = RAW_SCHEMA.empty_table()
    wanted = pa.array(sorted(set(prompts.column("sample_id").to_pylist())))
    existing = existing.filter(pc.is_in(existing.column("sample_id"), wanted))
    used = pc.sum(existing.column("completion_tokens")).as_py() or 0
    render = None
    if settings.rendered:
        render = history_renderer(HistoryRenderer(tokenizer, roles, target.template_kwargs))
    queue = TurnQueue(
        prompts.to_pylist(),
        last_turns(existing, settings.every_turn, settings.rendered),
        settings,
        roles,
        render,
    )
    state = dict(tokens=used, new=0)

    def requests():
        """Ready turns while the budget lasts; None while the next ones wait on replies."""
        while state["tokens"] < budget_tokens:
            request = queue.next_request()
            if request is None and not queue.in_flight:
                return
            yield request

    start = time.monotonic()
    if used < budget_tokens and queue.has_unsent():  # else no engine (no server) is started
        engine = engine or make_engine(gen, target, tokenizer)
        monitor = GenerationMonitor(
            name,
            queue.planned_turns,
            existing.num_rows,
            budget_tokens,
            used,
            others,
            getattr(engine, "urls", ()),
            api_key=getattr(engine, "api_key", None),
        )
        buffer: list[dict] = []

        def flush() -> None:
            if buffer:
                append_part(out_dir, pa.Table.from_pylist(buffer, schema=RAW_SCHEMA))
                buffer.clear()

        try:
            for done in engine.generate(requests(), sampling):
                prompt = queue.complete(done)
                buffer.append(completion_row(prompt, done, roles, engine.name, fp, tokenizer))
                state["tokens"] += len(done.output_ids)
                state["new"] += 1
                monitor.update(done)
                if len(buffer) >= gen.append_every:
                    flush()
        except EngineError:  # the servers gave up: the replies already back are kept
            flush()
            raise
        flush()
        monitor.print()
    else:
        print(f"[generate {name}] nothing left to generate: no engine started")
    elapsed = time.monotonic() - start
    table = read_raw(out_dir) if out_dir.exists() else RAW_SCHEMA.empty_table()
    table = table.filter(pc.is_in(table.column("sample_id"), wanted))
    compact(out_dir, table)

    new_tokens = state["tokens"] - used
    reasons = table.column("finish_reason").to_pylist()
    samples = pc.count_distinct(table.column("sample_id")).as_py()
    return {
        "dataset": name,
        "samples": samples,
        "prompts": len(wanted),
        "new_samples": samples - pc.count_distinct(existing.column("sample_id")).as_py(),
        "turns": table.num_rows,
        "new_turns": state["new"],
        "stopped_at_prompt_limit": queue.stopped_at_limit,
        "tokens": state["tokens"],
        "budget_tokens": budget_tokens,
        "budget_overshoot_tokens": max(state["tokens"] - budget_tokens, 0),
        "budget_reached": state["tokens"] >= budget_tokens,
        "failed": reasons.count("abort"),
        "tokens_per_s": round(new_tokens / elapsed, 1) if state["new"] else None,
        "engine": engine.name if engine else gen.engine,
        "fingerprint": fp,
    }


def main(
    dataset: str, prompts: PathOpt, out: PathOpt, report: PathOpt, params: Path = config.PARAMS_FILE
) -> None:
    """Generate the target's replies for one dataset: prompts file -> raw directory."""
    ds = config.dataset(dataset, params)
    budgets = {n: d.generate.budget_tokens for n, d in config.datasets(params).items()}
    gen = config.section(config.GenerateParams, "generate", params)
    target = config.section(config.TargetParams, "target", params)
    remove_stale_temps_around(out, report)
    metrics = generate_dataset(
        dataset,
        prompts,
        out,
        gen,
        ds.generate.budget_tokens,
        target,
        others=run_backlog(budgets, prompts.parent, out.parent),
    )
    if not metrics["new_turns"] and _describes(report, metrics):
        print(f"[generate {dataset}] {report} kept: it describes the output, which is unchanged")
    else:
        write_json(metrics, report)
    print(summary(f"generate {dataset}", metrics))


# What a run did rather than what its output holds: a rerun that generated nothing keeps the
# report of the run that did, so the report (a DVC output) hashes as before.
RUN_ONLY = ("new_samples", "new_turns", "tokens_per_s", "engine")


def _describes(report: Path, metrics: dict) -> bool:
    """Whether the report already there describes the same output as `metrics`."""
    try:
        before = json.loads(report.read_text())
    except (OSError, ValueError):
        return False
    return all(before.get(k) == v for k, v in metrics.items() if k not in RUN_ONLY)


if __name__ == "__main__":
    run(main)
