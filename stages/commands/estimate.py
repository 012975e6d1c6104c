"""`python -m stages.commands.estimate`: time a short sample of every dataset with the configured
engine and project the hours each dataset's generation will take, before committing GPUs for days.

Not a DVC stage: a tool run by hand next to `dvc repro` (the live monitor itself prints from
inside `python -m stages.generate`). Reads params `target`, `generate` and the datasets' budgets.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from ..cli import StageError, run
from ..params.datasets import read_datasets
from ..params.generate import GenerateParams
from ..params.schema import PARAMS_FILE
from ..params.target import TargetParams
from ..runtime.files import write_json
from ..runtime.progress import hms

REPLAY_TOLERANCE = 0.15  # the fitted server's time over the sample against its measured time


def main(
    samples: Annotated[
        int | None,
        typer.Option(
            help="prompts timed per dataset (default: 3 x the requests the engine generates "
            "at once, so that its pace is timed with every slot busy, as in a run)"
        ),
    ] = None,
    params: Annotated[Path, typer.Option(help="the params file")] = PARAMS_FILE,
    prompts_dir: Annotated[Path, typer.Option(help="the prep stage's prompts")] = Path(
        "data/prompts"
    ),
    raw_dir: Annotated[Path, typer.Option(help="what generate has written so far")] = Path(
        "data/raw"
    ),
    json_out: Annotated[
        Path | None, typer.Option(help="also write the settings and projections here as JSON")
    ] = None,
) -> None:
    """Time a sample of every dataset and project hours per dataset."""
    # imported here, not at the top: `eagle-pipeline --help` loads no engine
    from ..serving.monitor import run_backlog
    from ..serving.projection import project_hours, run_hours
    from ..wiring.engines import make_engine, sampling_for
    from ..wiring.target import target_roles, target_tokenizer

    gen = GenerateParams.read(params)
    target = TargetParams.read(params)
    budgets = {n: d.generate.budget_tokens for n, d in read_datasets(params).items()}
    paths = {name: prompts_dir / f"{name}.parquet" for name in budgets}
    for path in paths.values():
        if not path.exists():
            raise StageError(f"{path}: no prompts yet; run `dvc repro prep@{path.stem}` first")
    tokenizer = target_tokenizer(target)
    engine = make_engine(gen, target, tokenizer)
    per_dataset = samples or 3 * engine.slots
    picked = {name: _spread(path, per_dataset) for name, path in paths.items()}
    limits = engine.limits() if gen.engine == "sglang" else {}
    print(
        f"[estimate] {engine.name}: {engine.slots} requests generated at once{_servers(gen)}; "
        f"timing up to {per_dataset} prompts per dataset, after {engine.slots} untimed (a fresh "
        f"server compiles its first kernels)"
    )
    for url, said in limits.items():
        print(f"[estimate] {url} (/server_info): {_limits_line(said)}")
    projections = project_hours(
        engine,
        sampling_for(gen, target_roles(target, tokenizer)),
        picked,
        {b.dataset: b for b in run_backlog(budgets, prompts_dir, raw_dir)},
    )
    run_range = run_hours(projections)
    _print_projections(projections, run_range)
    notes = _notes(projections, limits, gen)
    for note in notes:
        print(f"[estimate] {note}")
    if json_out is not None:
        settings = dict(engine=engine.name, slots=engine.slots, servers=limits)
        _write(json_out, settings, projections, run_range, notes)


def _write(path: Path, settings: dict, projections, run_range, notes: list[str]) -> None:
    rows = [dataclasses.asdict(p) for p in projections]
    run_row = dict(zip(("hours", "hours_low", "hours_high"), run_range))
    write_json(dict(settings=settings, datasets=rows, run=run_row, notes=notes), path)


def _spread(path: Path, n: int) -> list[tuple[str, list[int]]]:
    """`n` prompts spread evenly over the file (its first ones may all be alike)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["sample_id", "prompt_ids"])
    step = max(table.num_rows // n, 1)
    rows = table.take(list(range(0, table.num_rows, step))[:n]).to_pylist()
    return [(r["sample_id"], r["prompt_ids"]) for r in rows]


def _print_projections(projections, run: tuple[float, float, float]) -> None:
    print(
        f"{'dataset':<24}{'samples':>8}{'failed':>8}{'mean in':>9}{'mean out':>10}"
        f"{'pace tok/s':>12}{'requests left':>15}{'tokens left':>14}{'time':>12}"
        f"{'10-90%':>22}"
    )
    for p in projections:
        pace = f"{p.tokens_per_s:,.0f}{'' if p.busy_s else '*'}"
        spread = f"{hms(p.hours_low * 3600)}-{hms(p.hours_high * 3600)}"
        print(
            f"{p.dataset:<24}{p.samples:>8}{p.failed:>8}{p.mean_prompt_tokens:>9,.0f}"
            f"{p.mean_output_tokens:>10,.0f}{pace:>12}{p.requests_left:>15,}"
            f"{p.tokens_left:>14,.0f}{hms(p.hours * 3600):>12}{spread:>22}"
        )
    tokens, (hours, low, high) = sum(p.tokens_left for p in projections), run
    spread = f"{hms(low * 3600)}-{hms(high * 3600)}"
    print(
        f"{'run':<24}{'':>8}{'':>8}{'':>9}{'':>10}{'':>12}{'':>15}{tokens:>14,.0f}"
        f"{hms(hours * 3600):>12}{spread:>22}"
    )
    print(
        "pace: the fitted server's tokens/s with every slot busy; time: the median over redraws "
        "of the sample, 10-90%: their range"
    )
    if not all(p.busy_s for p in projections):
        print(
            "* the sample never had every slot busy: its pace is extrapolated from fewer "
            "requests in flight; raise --samples"
        )


def _servers(gen: GenerateParams) -> str:
    if gen.engine == "sglang":
        urls = gen.sglang.urls if gen.sglang.launch is None else ["the launched server"]
        return f" ({len(urls)} server(s) x generate.sglang.concurrency {gen.sglang.concurrency})"
    return f" (generate.batch_size {gen.batch_size})"


def _limits_line(said: dict) -> str:
    context, kv = said.get("context_length"), said.get("kv_cache_tokens")
    running = said.get("max_running_requests")
    context_text = "the model's own" if context is None else f"{context:,}"
    kv_text = "not reported" if kv is None else f"{kv:,} tokens"
    running_text = "as many as the KV cache holds" if running is None else f"{running:,}"
    return f"context length {context_text}, KV cache {kv_text}, max running requests {running_text}"


def _notes(projections, limits: dict[str, dict], gen: GenerateParams) -> list[str]:
    """Where the fitted server does not replay its own sample, and where a server's KV cache
    holds fewer of a dataset's requests than it is sent at once (the rest wait in its queue,
    which the timed sample includes)."""
    notes = []
    for p in projections:
        if p.sample_s and abs(p.replayed_s / p.sample_s - 1) > REPLAY_TOLERANCE:
            notes.append(
                f"{p.dataset}: the fitted server replays the sample in {p.replayed_s:,.1f} s, "
                f"against {p.sample_s:,.1f} s measured: the servers' steps do not follow the "
                f"requests in flight, and the projection is less sure than its range says"
            )
    for url, said in limits.items():
        kv = said.get("kv_cache_tokens")
        for p in projections:
            per_request = p.mean_prompt_tokens + p.mean_output_tokens
            if kv and per_request and kv / per_request < gen.sglang.concurrency:
                notes.append(
                    f"{p.dataset}: {url}'s KV cache holds about {kv / per_request:,.0f} of its "
                    f"requests at once, under the {gen.sglang.concurrency} sent to it: the rest "
                    f"queue in the server (the timed sample includes that wait)"
                )
    return notes


if __name__ == "__main__":
    run(main)
