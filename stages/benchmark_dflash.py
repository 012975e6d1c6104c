"""benchmark_dflash: speculative decoding with the target and the EXPORTED DFlash drafter (loaded
back from models/dflash as SGLang reads it), against plain decoding of the same target, on the
EAGLE-3 benchmark's prompts, temperatures and reply length (params `benchmark`, `target`).

The drafter drafts a block of block_size tokens per verify step (the last accepted token, then
block_size - 1 drafts), the block size it was trained and exported with (its config.json): SGLang
serves it at that width unless told otherwise. Writes reports/benchmark_dflash.json, the EAGLE-3
benchmark's records with the tokens verified per step beside tau, and
reports/plots/benchmark_dflash_acceptance.csv. Mode `sglang` serves it with
--speculative-algorithm DFLASH (stages/serving/launch.py `Speculation`).

Where train_dflash trained no drafter (extract.drafters leaves out dflash, and models/dflash is
left empty), nothing loads: the report is a NotTrained record saying why and the CSV holds only
its header, so the report stage prints "not trained" in place of the figures.
"""

from __future__ import annotations

from pathlib import Path

from .cli import PathOpt, run
from .dflash.export import check_export, load_dflash, sglang_view
from .dflash.speculate import dflash_generate
from .drafter.export import PROJECT_KEY, read_exported_config
from .params.schema import PARAMS_FILE
from .reports.benchmark import DFLASH_RECORDS, NotTrained
from .runtime.files import write_csv
from .runtime.outputs import remove_stale_temps_around
from .serving.launch import Speculation
from .wiring.benchmark import ACCEPTANCE_COLUMNS, Family, Speculate, measure_drafter


def dflash(drafter_dir: Path, block_size: int) -> Family:
    """The exported DFlash drafter, verified in blocks of `block_size`."""

    def load(target) -> Speculate:  # a PreTrainedModel
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


def is_untrained(drafter_dir: Path) -> bool:
    """An empty drafter directory is how train_dflash says it trained nothing; any other
    missing or broken export is a fault, refused by the export check."""
    return drafter_dir.is_dir() and not any(drafter_dir.iterdir())


def write_not_trained(drafter_dir: Path, report: Path, plot: Path) -> None:
    """The stage's outputs with no drafter to measure: the NotTrained record, the CSV's header."""
    remove_stale_temps_around(report, plot)  # a killed run's half-written report
    reason = f"extract.drafters leaves out dflash, so train_dflash left {drafter_dir} empty"
    NotTrained(drafter="DFlash", trained=False, reason=reason).write(report)
    write_csv([], plot, ACCEPTANCE_COLUMNS)
    print(f"[benchmark_dflash] DFlash not trained: {reason}; nothing to measure")


def main(
    merged: PathOpt,
    drafter_dir: PathOpt,
    report: PathOpt,
    plot: PathOpt,
    params: Path = PARAMS_FILE,
) -> None:
    """Measure acceptance length and speedup of the exported DFlash drafter (or, with none
    trained, write a report saying so)."""
    if is_untrained(drafter_dir):
        write_not_trained(drafter_dir, report, plot)
        return

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
