"""generate@<dataset>: prompt ids -> the target's raw output ids, resumable, within a token budget.

Reads params `target`, `generate` and `datasets.<name>.generate`. Output data/raw/<name>/ persists
across runs: turns already generated under the same generation facts (model, template,
sampling, regenerate mode, the engine's dtype; compared as values, whatever formula hashed them
into the rows' fingerprint, and rows from before the facts were recorded by that time's formula)
are skipped and conversations continue where they stopped; a changed fact starts the dataset
over, the earlier generation left in place until this run's first turns are appended (a run that
fails or is killed before that leaves it as it was). With
`regenerate: all_turns_rendered` each later turn's prompt is rendered by the chat template from
the conversation so far (target/history.py).
Writes reports/generate/<name>.json.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .artifacts.prompts import PromptSettings, read_prompts
from .artifacts.raw import (
    RAW_SCHEMA,
    append_part,
    compact,
    drop_corrupt_parts,
    facts_fingerprint,
    generations,
    last_turns,
    part_facts,
    parts,
    read_raw,
)
from .cli import PathOpt, StageError, run, summary
from .engines import AuthError, Completion, Engine, EngineError, Request, Sampling
from .engines.turns import Output, RenderPrompt, TurnQueue
from .params.datasets import read_dataset, read_datasets
from .params.generate import GenerateParams
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .reports.generate import GenerateReport
from .reports.record import ReportError
from .runtime.files import remove_with_checksum
from .runtime.outputs import output_lock, remove_stale_temps, remove_stale_temps_around
from .serving.monitor import Backlog, GenerationMonitor, run_backlog
from .target_model.history import HistoryRenderer
from .target_model.tokens import TokenRoles, analyze_output
from .wiring.engines import make_engine, sampling_for
from .wiring.generation import LEGACY_COMMIT, engine_facts, legacy_fingerprint, recipe_facts
from .wiring.target import target_roles, target_tokenizer

# Where each generation fact comes from, for the line that says which one changed.
FACT_SOURCES = {
    "model_files": "the files in target.path or the transformers version",
    "chat_template": "target.chat_template's file",
    "template_kwargs": "target.template_kwargs",
    "roles": "target.roles",
    "sampling": "generate's sampling values",
    "regenerate": "datasets.<name>.prep.regenerate",
    "dtype": "target.dtype under the hf engine, the server's --dtype under sglang",
    "quantization": "the server's --quantization",
    "kv_cache_dtype": "the server's --kv-cache-dtype, named only where it is not the model's dtype",
    "served_model": "the model the server serves (its /server_info model_path)",
}


@dataclass(frozen=True)
class Stamp:
    """What every row of a run records of how it was generated, made once a run: the engine,
    the generation facts' fingerprint and the facts as JSON."""

    engine: str
    fingerprint: str
    generated_by: str

    @classmethod
    def of(cls, engine: str, facts: dict) -> Stamp:
        return cls(engine, facts_fingerprint(facts), json.dumps(facts, sort_keys=True))


def history_renderer(renderer: HistoryRenderer) -> RenderPrompt:
    """The turn queue's callback for all_turns_rendered: a prompts row's message segments and
    tools (JSON columns) and the turns so far -> the next turn's rendered prompt."""

    def render(row: dict, outputs: list[Output]) -> list[int]:
        segments = [json.loads(s) for s in row["turn_messages"][: len(outputs) + 1]]
        tools = json.loads(row["tools"]) if row["tools"] else None
        return renderer.prompt(segments, tools, outputs)

    return render


def completion_row(
    prompt: dict, done: Completion, roles: TokenRoles, stamp: Stamp, tokenizer
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
        engine=stamp.engine,
        fingerprint=stamp.fingerprint,
        generated_by=stamp.generated_by,
        output_text=tokenizer.decode(done.output_ids, skip_special_tokens=False),
    )


def generate_dataset(
    name: str,
    prompts_path: Path,
    out_dir: Path,
    gen: GenerateParams,
    budget_tokens: int,
    target: TargetParams,
    engine=None,
    others: Sequence[Backlog] = (),
) -> GenerateReport:
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
    gen: GenerateParams,
    budget_tokens: int,
    target: TargetParams,
    engine,
    others: Sequence[Backlog],
) -> GenerateReport:
    """The stage as its steps: the raw data earlier runs left, the turns it leaves queued, an
    engine started only if the budget and the queue leave it something to do, then the raw data
    compacted and reported."""
    tokenizer = target_tokenizer(target)
    roles = target_roles(target, tokenizer)
    sampling = sampling_for(gen, roles)
    prompts, settings = read_prompts(prompts_path)
    now = _now(target, sampling, settings.regenerate, engine, gen)
    existing, earlier = _resumable_raw(name, out_dir, now)
    wanted = pa.array(sorted(set(prompts.column("sample_id").to_pylist())))

    def planned(existing: pa.Table) -> tuple[pa.Table, _Budget, TurnQueue]:
        existing = existing.filter(pc.is_in(existing.column("sample_id"), wanted))
        budget = _Budget(budget_tokens, pc.sum(existing.column("completion_tokens")).as_py() or 0)
        queue = _turn_queue(prompts, existing, settings, roles, tokenizer, target.template_kwargs)
        return existing, budget, queue

    existing, budget, queue = planned(existing)
    fp = existing.column("fingerprint")[-1].as_py() if existing.num_rows else None
    elapsed = 0.0
    with earlier.kept_unless_begun():
        if budget.used < budget.limit and queue.has_unsent():  # else no engine is started
            engine = engine or make_engine(gen, target, tokenizer)
            facts = now.facts
            if facts is None:
                facts = now.recipe | engine_facts(engine, target)
                now = replace(now, facts=facts)
                if earlier.served_otherwise(now, generations(existing)):
                    existing, budget, queue = planned(RAW_SCHEMA.empty_table())
            stamp = Stamp.of(engine.name, facts)
            fp = stamp.fingerprint
            monitor = _monitor(name, engine, queue, existing.num_rows, budget, others)
            elapsed = _generate_turns(
                engine,
                queue,
                sampling,
                budget,
                monitor,
                out_dir,
                gen.append_every,
                lambda prompt, done: completion_row(prompt, done, roles, stamp, tokenizer),
                earlier.begun,
            )
            monitor.print()
        else:
            print(f"[generate {name}] nothing left to generate: no engine started")
    table = _compacted(out_dir, wanted)
    engine_name = engine.name if engine else gen.engine
    return _report(name, fp, engine_name, table, wanted, existing, queue, budget, elapsed)


def _now(
    target: TargetParams, sampling: Sampling, regenerate: str, engine, gen: GenerateParams
) -> _Now:
    """This run's generation before any engine is started: the hf engine's facts are in params,
    a server's are known once it answers (None until then)."""
    recipe = recipe_facts(target, sampling, regenerate)
    known = engine is not None or gen.engine == "hf"
    facts = recipe | engine_facts(engine, target) if known else None
    return _Now(recipe, facts, legacy_fingerprint(target, sampling, regenerate))


@dataclass(frozen=True)
class _Now:
    """This run's generation as earlier rows are held against it: rows that recorded their facts
    by those values, whatever formula hashed them into their fingerprint; rows from before
    generated_by by the fingerprint the stage wrote then (legacy_fingerprint)."""

    recipe: dict
    facts: dict | None  # None until a server engine answers: rows are held to the recipe alone
    legacy: str

    def made(self, fp: str, recorded: dict | None) -> bool:
        """Whether rows of fingerprint `fp` that recorded `recorded` were generated as this
        run generates."""
        if recorded is None:
            return fp == self.legacy
        if self.facts is None:
            return _holds(recorded, self.recipe)
        return json.dumps(recorded, sort_keys=True) == json.dumps(self.facts, sort_keys=True)

    def changed(self, before: tuple[str, dict | None]) -> str:
        """What differs between `before`'s generation and this run's, named for the line that
        says a dataset starts over."""
        fp, recorded = before
        if recorded is None:
            return (
                f"fingerprint {fp} from before the facts were recorded, where the stage of "
                f"commit {LEGACY_COMMIT} writes {self.legacy} for these params (the model, chat "
                f"template, template_kwargs, roles, target.dtype, sampling or regenerate mode)"
            )
        return changes((fp, recorded), self.recipe if self.facts is None else self.facts)


@dataclass
class _Budget:
    """The token budget as the run spends it, shared by the requests (they stop once it is
    spent), the loop that counts each reply and the report: `used` by the turns kept from
    earlier runs, `tokens` those and the replies so far, `new` the turns this run generated."""

    limit: int
    used: int
    tokens: int = field(init=False)
    new: int = 0

    def __post_init__(self) -> None:
        self.tokens = self.used


def _resumable_raw(name: str, out_dir: Path, now: _Now) -> tuple[pa.Table, _Earlier]:
    """The raw turns earlier runs left that this run continues from (a killed run's temporary
    files and corrupt parts go: their turns are generated again), and the parts of an earlier
    generation under other facts, which stay until this run's first turns land."""
    remove_stale_temps(out_dir)
    for part, problem in drop_corrupt_parts(out_dir):
        print(f"[generate {name}] {part}: {problem}; removed, its turns are generated again")
    by_part = {part: part_facts(part) for part in parts(out_dir)}
    current = _current_parts(by_part, now)
    earlier = _Earlier(name, out_dir, [p for p in by_part if p not in current])
    if current:
        earlier.begun()  # any other parts: a replacement had begun (appended, then stopped)
        return read_raw(out_dir), earlier
    if not by_part:
        return RAW_SCHEMA.empty_table(), earlier
    earlier.starting_over(now.changed(next(f for fps in by_part.values() for f in fps.items())))
    return RAW_SCHEMA.empty_table(), earlier


def _current_parts(by_part: dict[Path, dict[str, dict | None]], now: _Now) -> list[Path]:
    """The parts of this run's generation: with the facts known, those with a row generated
    under them; with a server not asked yet, those whose rows all hold the recipe, and of
    them a begun replacement's alone (recording no facts but those of the last that records)."""
    if now.facts is not None:
        return [p for p, fps in by_part.items() if any(now.made(*f) for f in fps.items())]
    current = [p for p, fps in by_part.items() if all(now.made(*f) for f in fps.items())]
    recorded = {
        p: {json.dumps(f, sort_keys=True) for f in by_part[p].values() if f is not None}
        for p in current
    }
    last = next((r for r in reversed(recorded.values()) if r), set())
    return [p for p in current if recorded[p] <= last]


def _holds(facts: dict | None, recipe: dict) -> bool:
    return facts is not None and all(facts.get(k) == v for k, v in recipe.items())


def changes(before: tuple[str, dict], now: dict) -> str:
    """Which generation facts differ between an earlier fingerprint's and this run's, each with
    its values and where it comes from."""
    fp, facts = before
    lines = []
    for key in [*now, *(k for k in facts if k not in now)]:  # a fact now left out too
        was, value = facts.get(key), now.get(key)
        if was == value:
            continue
        if isinstance(was, dict) and isinstance(value, dict):
            inner = [
                f"{key}.{k} {was.get(k)!r} -> {value.get(k)!r}"
                for k in sorted(was.keys() | value.keys())
                if was.get(k) != value.get(k)
            ]
            lines.append(f"{', '.join(inner)} ({FACT_SOURCES.get(key, key)})")
        else:
            lines.append(f"{key} {was!r} -> {value!r} ({FACT_SOURCES.get(key, key)})")
    return "; ".join(lines) or f"fingerprint {fp}, now {facts_fingerprint(now)}"


@dataclass
class _Earlier:
    """The parts of an earlier generation a changed fingerprint replaces: removed once the
    replacement has begun for real (its first part appended) or has completed, never before."""

    name: str
    out_dir: Path
    parts: list[Path]

    def begun(self) -> None:
        for part in self.parts:
            remove_with_checksum(part)
        self.parts.clear()

    @contextlib.contextmanager
    def kept_unless_begun(self) -> Iterator[None]:
        """Around the generation: a completed run leaves only its own turns; one that fails
        before its first append leaves the earlier ones as they were, and says so."""
        try:
            yield
        except BaseException:
            if self.parts:
                print(
                    f"[generate {self.name}] the earlier raw data in {self.out_dir} is kept as "
                    f"it was ({len(self.parts)} part(s)): no turn was generated in its place"
                )
            raise
        self.begun()

    def served_otherwise(self, now: _Now, kept: dict[str, dict | None]) -> bool:
        """Whether a kept generation (fingerprint -> recorded facts) was made under other
        server facts than `now`'s (the recipe alone matched it): then the kept turns too stay
        only until this run's first append."""
        other = next(((fp, f) for fp, f in kept.items() if not now.made(fp, f)), None)
        if other is None:
            return False
        self.parts = parts(self.out_dir)
        self.starting_over(now.changed(other))
        return True

    def starting_over(self, changed: str) -> None:
        turns = read_raw(self.out_dir).num_rows
        print(
            f"[generate {self.name}] the raw data in {self.out_dir} was generated otherwise: "
            f"{changed}; so {self.name} is generated again from the start; its "
            f"{turns} earlier turns stay until this run's first turns are appended"
        )


def _turn_queue(
    prompts: pa.Table,
    existing: pa.Table,
    settings: PromptSettings,
    roles: TokenRoles,
    tokenizer,
    template_kwargs: dict,
) -> TurnQueue:
    """Built from the kept raw data so that each conversation continues where it stopped; with
    all_turns_rendered each later prompt is rendered from the conversation so far."""
    render = None
    if settings.rendered:
        render = history_renderer(HistoryRenderer(tokenizer, roles, template_kwargs))
    return TurnQueue(
        prompts.to_pylist(),
        last_turns(existing, settings.every_turn, settings.rendered),
        settings,
        roles,
        render,
    )


def _monitor(
    name: str,
    engine: Engine,
    queue: TurnQueue,
    kept_turns: int,
    budget: _Budget,
    others: Sequence[Backlog],
) -> GenerationMonitor:
    """The live progress line, against the whole dataset and budget (the kept turns count as
    done) and beside the other datasets' backlog, with the servers' metrics where the engine
    has servers."""
    return GenerationMonitor(
        name,
        queue.planned_turns,
        kept_turns,
        budget.limit,
        budget.used,
        others,
        getattr(engine, "urls", ()),
        api_key=getattr(engine, "api_key", None),
    )


def _requests(queue: TurnQueue, budget: _Budget) -> Iterator[Request | None]:
    """Ready turns while the budget lasts; None while the next ones wait on replies."""
    while budget.tokens < budget.limit:
        request = queue.next_request()
        if request is None and not queue.in_flight:
            return
        yield request


def _generate_turns(
    engine: Engine,
    queue: TurnQueue,
    sampling: Sampling,
    budget: _Budget,
    monitor: GenerationMonitor,
    out_dir: Path,
    append_every: int,
    raw_row: Callable[[dict, Completion], dict],
    appended: Callable[[], None],
) -> float:
    """The engine's replies, counted against the budget as they come back, appended in raw parts
    of `append_every` turns (`appended` told after each): a kill loses at most one part's turns,
    and when the servers give up the replies already back are kept. Returns its seconds, the
    report's tokens/s (an engine's start and the compaction are not generating)."""
    buffer: list[dict] = []
    start = time.monotonic()

    def flush() -> None:
        if buffer:
            append_part(out_dir, pa.Table.from_pylist(buffer, schema=RAW_SCHEMA))
            buffer.clear()
            appended()

    try:
        for done in engine.generate(_requests(queue, budget), sampling):
            prompt = queue.complete(done)
            buffer.append(raw_row(prompt, done))
            budget.tokens += len(done.output_ids)
            budget.new += 1
            monitor.update(done)
            if len(buffer) >= append_every:
                flush()
    except EngineError:  # the servers gave up: the replies already back are kept
        flush()
        raise
    flush()
    return time.monotonic() - start


def _compacted(out_dir: Path, wanted: pa.Array) -> pa.Table:
    """The raw data as one part, turns of samples no longer among the prompts left out: what the
    merge stage reads and the report describes."""
    table = read_raw(out_dir) if out_dir.exists() else RAW_SCHEMA.empty_table()
    table = table.filter(pc.is_in(table.column("sample_id"), wanted))
    compact(out_dir, table)
    return table


def _report(
    name: str,
    fp: str | None,
    engine_name: str,
    table: pa.Table,
    wanted: pa.Array,
    existing: pa.Table,
    queue: TurnQueue,
    budget: _Budget,
    elapsed: float,
) -> GenerateReport:
    """reports/generate/<name>.json: what the raw data holds, which a rerun that generated
    nothing compares (RUN_ONLY aside), and what this run added and how fast."""
    reasons = table.column("finish_reason").to_pylist()
    samples = pc.count_distinct(table.column("sample_id")).as_py()
    return GenerateReport(
        dataset=name,
        samples=samples,
        prompts=len(wanted),
        new_samples=samples - pc.count_distinct(existing.column("sample_id")).as_py(),
        turns=table.num_rows,
        new_turns=budget.new,
        stopped_at_prompt_limit=queue.stopped_at_limit,
        tokens=budget.tokens,
        budget_tokens=budget.limit,
        budget_overshoot_tokens=max(budget.tokens - budget.limit, 0),
        budget_reached=budget.tokens >= budget.limit,
        failed=reasons.count("abort"),
        tokens_per_s=round((budget.tokens - budget.used) / elapsed, 1) if budget.new else None,
        engine=engine_name,
        fingerprint=fp,
    )


def main(
    dataset: str, prompts: PathOpt, out: PathOpt, report: PathOpt, params: Path = PARAMS_FILE
) -> None:
    """Generate the target's replies for one dataset: prompts file -> raw directory."""
    ds = read_dataset(dataset, params)
    budgets = {n: d.generate.budget_tokens for n, d in read_datasets(params).items()}
    gen = GenerateParams.read(params)
    target = TargetParams.read(params)
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
    if not metrics.new_turns and _describes(report, metrics):
        print(f"[generate {dataset}] {report} kept: it describes the output, which is unchanged")
    else:
        metrics.write(report)
    print(summary(f"generate {dataset}", metrics.to_json()))


def _describes(report: Path, metrics: GenerateReport) -> bool:
    """Whether the report already there describes the same output as `metrics` (a rerun that
    generated nothing keeps the report of the run that did, so it hashes as before)."""
    try:
        before = GenerateReport.read(report)
    except ReportError:
        return False
    return before.describes_as(metrics)


if __name__ == "__main__":
    run(main)
