"""`python -m stages.commands.estimate`: time a short sample of every dataset with the configured
engine and project the hours each dataset's generation will take, before committing GPUs for days.

Not a DVC stage: a tool run by hand next to `dvc repro` (the live monitor itself prints from
inside `python -m stages.generate`). Reads params `target`, `generate` and the datasets' budgets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..cli import StageError, run
from ..params.datasets import read_datasets
from ..params.generate import GenerateParams
from ..params.schema import PARAMS_FILE
from ..params.target import TargetParams


def main(
    samples: Annotated[int, typer.Option(help="prompts timed per dataset")] = 32,
    params: Annotated[Path, typer.Option(help="the params file")] = PARAMS_FILE,
    prompts_dir: Annotated[Path, typer.Option(help="the prep stage's prompts")] = Path(
        "data/prompts"
    ),
    raw_dir: Annotated[Path, typer.Option(help="what generate has written so far")] = Path(
        "data/raw"
    ),
) -> None:
    """Time `samples` prompts per dataset and project hours per dataset."""
    # imported here, not at the top: `eagle-pipeline --help` loads no engine
    import pyarrow.parquet as pq

    from ..serving.monitor import project_hours, run_backlog
    from ..wiring.engines import make_engine, sampling_for
    from ..wiring.target import target_roles, target_tokenizer

    gen = GenerateParams.read(params)
    target = TargetParams.read(params)
    budgets = {n: d.generate.budget_tokens for n, d in read_datasets(params).items()}
    picked = {}
    for name in budgets:
        path = prompts_dir / f"{name}.parquet"
        if not path.exists():
            raise StageError(f"{path}: no prompts yet; run `dvc repro prep@{name}` first")
        table = pq.read_table(path, columns=["sample_id", "prompt_ids"])
        step = max(table.num_rows // samples, 1)
        rows = table.take(list(range(0, table.num_rows, step))[:samples]).to_pylist()
        picked[name] = [(r["sample_id"], r["prompt_ids"]) for r in rows]
    tokenizer = target_tokenizer(target)
    engine = make_engine(gen, target, tokenizer)
    rate, projections = project_hours(
        engine,
        sampling_for(gen, target_roles(target, tokenizer)),
        picked,
        {b.dataset: b for b in run_backlog(budgets, prompts_dir, raw_dir)},
    )
    print(
        f"[estimate] {engine.name}: {rate:,.0f} generated tokens/s over "
        f"{sum(p.samples for p in projections)} samples"
    )
    print(
        f"{'dataset':<24}{'samples':>8}{'failed':>8}{'mean out':>10}{'tokens left':>14}{'hours':>9}"
    )
    for p in projections:
        print(
            f"{p.dataset:<24}{p.samples:>8}{p.failed:>8}{p.mean_output_tokens:>10,.0f}"
            f"{p.tokens_left:>14,.0f}{p.hours:>9.2f}"
        )
    print(
        f"{'run':<24}{'':>8}{'':>8}{'':>10}{sum(p.tokens_left for p in projections):>14,.0f}"
        f"{sum(p.hours for p in projections):>9.2f}"
    )


if __name__ == "__main__":
    run(main)
