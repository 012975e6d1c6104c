"""benchmark: speculative decoding with the target and the EXPORTED EAGLE-3 drafter (loaded back
from models/drafter, which proves the export), against plain decoding of the same target.

Reads params `benchmark` and `target`. Held-out prompts: the eval split's prompts (already in the
serving chat template) per dataset, plus any prompt files under benchmark.datasets (MT-bench,
GSM8K, HumanEval...). Chain drafting of benchmark.num_steps, topk 1 (num_steps + 1 tokens
verified per step), at each temperature. Writes reports/benchmark.json (tau, per-position
acceptance conditional and unconditional, per dataset) and reports/plots/benchmark_acceptance.csv.

Mode `hf` decodes in-process (wall-clock speedup of this loop). Mode `sglang` sends the same
prompt ids to the target served by SGLang with the drafter (EAGLE3) and without (attached, or
launched from params one after the other): tau from meta_info.spec_verify_ct, output tokens/s of
both servers at the same concurrency, the speedup, both launch commands and the server's version.
The measurement is the DFlash benchmark's too (stages/wiring/benchmark.py).
"""

from __future__ import annotations

from pathlib import Path

from .cli import PathOpt, run
from .drafter.export import check_exported, load_drafter
from .drafter.speculate import speculative_generate
from .params.benchmark import BenchmarkParams
from .params.schema import PARAMS_FILE
from .reports.benchmark import EAGLE3_RECORDS
from .serving.launch import Speculation
from .wiring.benchmark import Family, Speculate, measure_drafter


def eagle3(drafter_dir: Path, num_steps: int) -> Family:
    """The exported EAGLE-3 drafter, as a chain of `num_steps` drafts."""

    def load(target) -> Speculate:  # a PreTrainedModel
        drafter, _ = load_drafter(drafter_dir)
        weight = next(target.parameters())  # the drafter runs as the target does, as when served
        drafter = drafter.to(weight.device, weight.dtype).eval()
        embed = target.get_input_embeddings()
        return lambda prompt, max_new, temperature, stop_ids, generator: speculative_generate(
            target, drafter, embed, prompt, max_new, num_steps, temperature, stop_ids, generator
        )

    return Family(
        "EAGLE-3",
        "chain",
        Speculation.eagle3(drafter_dir, num_steps),
        load,
        EAGLE3_RECORDS,
        "spec_url",
    )


def main(
    merged: PathOpt,
    drafter_dir: PathOpt,
    report: PathOpt,
    plot: PathOpt,
    params: Path = PARAMS_FILE,
) -> None:
    """Measure acceptance length and speedup of the exported EAGLE-3 drafter."""
    num_steps = BenchmarkParams.read(params).num_steps

    def family(target_config) -> Family:
        check_exported(drafter_dir, target_config)
        return eagle3(drafter_dir, num_steps)

    measure_drafter(merged, report, plot, params, family)


if __name__ == "__main__":
    run(main)
