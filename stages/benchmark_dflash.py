"""benchmark_dflash: speculative decoding with the target and the EXPORTED DFlash drafter (loaded
back from models/dflash as SGLang reads it), against plain decoding of the same target, on the
EAGLE-3 benchmark's prompts, temperatures and reply length (params `benchmark`, `target`).

The drafter drafts a block of block_size tokens per verify step (the last accepted token, then
block_size - 1 drafts), the block size it was trained and exported with (its config.json): SGLang
serves it at that width unless told otherwise. Writes reports/benchmark_dflash.json, the EAGLE-3
benchmark's records with the tokens verified per step beside tau, and
reports/plots/benchmark_dflash_acceptance.csv. Mode `sglang` serves it with
--speculative-algorithm DFLASH (stages/serving/launch.py `Speculation`).
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from .cli import PathOpt, run
from .dflash.export import check_export, load_dflash, sglang_view
from .dflash.speculate import dflash_generate
from .drafter.export import PROJECT_KEY, read_exported_config
from .params.schema import PARAMS_FILE
from .reports.benchmark import DFLASH_RECORDS
from .serving.launch import Speculation
from .wiring.benchmark import Family, Speculate, measure_drafter


def dflash(drafter_dir: Path, block_size: int) -> Family:
    """The exported DFlash drafter, verified in blocks of `block_size`."""

    def load(target: PreTrainedModel) -> Speculate:
        weight = next(target.parameters())  # the drafter runs as the target does, as when served
        drafter = load_dflash(drafter_dir).to(weight.device, weight.dtype).eval()
        return lambda prompt, max_new, temperature, stop_ids, generator: dflash_generate(
            target, drafter, prompt, max_new, temperature, stop_ids, generator, block_size
        )

    return Family(
        "DFlash",
        "block",
        Speculation.dflash(drafter_dir, block_size),
        load,
        DFLASH_RECORDS,
        "dflash_url",
    )


def main(
    merged: PathOpt,
    drafter_dir: PathOpt,
    report: PathOpt,
    plot: PathOpt,
    params: Path = PARAMS_FILE,
) -> None:
    """Measure acceptance length and speedup of the exported DFlash drafter."""

    def family(target_config) -> Family:
        """The export checked against the target (and the SGLang release it was written for)
        before anything loads it: the check names every fault."""
        config = read_exported_config(drafter_dir)
        version = (config.get(PROJECT_KEY) or {}).get("sglang_version")
        check_export(drafter_dir, target_config, sglang_version=version)
        return dflash(drafter_dir, sglang_view(config).block_size)

    measure_drafter(merged, report, plot, params, family)


if __name__ == "__main__":
    run(main)
