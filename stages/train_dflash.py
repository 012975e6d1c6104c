"""train_dflash: the DFlash drafter on the extracted hidden states, then its export.

Reads params `dflash` (and the target path from `target`). The drafter is conditioned on the
target layers extract captured (meta.json's HF indices; SGLang's `target_layer_ids` are derived
from them, and the export is checked to name them). Trained by the same loop as EAGLE-3
(stages/drafter/training.py) with DFlash's objective: resumes from models/dflash_checkpoints/
last.pt, keeps best.pt by tau (tokens one verify step accepts, on the eval split), exports the best
to models/dflash/ (config.json + model.safetensors, as SGLang's DFLASH worker loads them, checked
key by key). Writes reports/train_dflash.json, reports/plots/train_dflash_loss.csv,
reports/plots/train_dflash_evals.csv (tau per evaluation) and
reports/plots/train_dflash_accuracy.csv (per draft position, at the best evaluation). Under
torchrun it trains data-parallel (DDP).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .artifacts import hidden
from .cli import PathOpt, StageError, params_key, run, summary
from .dflash.export import check_export, export_dflash
from .dflash.model import DFlashConfig, DFlashDrafter
from .dflash.objective import DFlashObjective
from .drafter.export import PROJECT_KEY, read_exported_config
from .drafter.training import History, TrainingSettings, compiles, train
from .params.dflash import DFlashParams
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .reports.train_dflash import TrainDFlashReport
from .runtime import parallel
from .runtime.device import resolve_device
from .runtime.files import write_csv
from .target_model.weights import embedding_and_head
from .wiring.drafter_run import (
    best_checkpoint,
    checkpoint_identity,
    complete_run,
    guarded_outputs,
    loop_settings,
    prepare,
    refuse_unservable_rope,
    serving_target,
    start_run,
    verified_splits,
)

STAGE = "train_dflash"


def main(
    hidden_dir: PathOpt,
    checkpoint_dir: PathOpt,
    out_dir: PathOpt,
    report: PathOpt,
    plots: PathOpt,
    params: Path = PARAMS_FILE,
) -> None:
    """Train the DFlash drafter (torchrun for several GPUs) and export the best checkpoint."""
    p = DFlashParams.read(params)
    target = TargetParams.read(params)
    rank, device = parallel.start(resolve_device(p.device))
    with guarded_outputs(STAGE, rank, checkpoint_dir, out_dir, report, plots / f"{STAGE}_loss.csv"):
        started = time.monotonic()
        prepare(p, "dflash", rank, device)
        meta = hidden.read_meta(hidden_dir)
        target_config, objective = _objective(p, target, meta, rank)
        train_set, eval_set = verified_splits(hidden_dir, p.max_length, rank)
        s = loop_settings(p, len(train_set), TrainingSettings)
        start_run(STAGE, checkpoint_dir, checkpoint_identity(p, meta.fingerprint), rank)
        if rank.main:
            print(
                f"[{STAGE}] {len(train_set)} train / {len(eval_set)} eval samples, "
                f"{s.total_steps} steps, blocks of {p.block_size}, target layers "
                f"{list(objective.drafter.cfg.target_layer_ids)}, draft "
                f"{sum(x.numel() for x in objective.drafter.parameters()):,} parameters on "
                f"{device} x {rank.world}"
            )
        history = train(objective, train_set, eval_set, s, checkpoint_dir, device, rank)
        if rank.main:
            _export_best(objective.drafter, checkpoint_dir, out_dir, target_config, p, meta)
            compiled = compiles(s.compile, device) and history.compile_failed_at is None
            seconds = time.monotonic() - started
            _write_reports(
                history, s, objective.drafter.cfg, (rank.world, compiled, seconds), report, plots
            )
            complete_run(checkpoint_dir)
    parallel.stop()


def _objective(
    p: DFlashParams, target: TargetParams, meta: hidden.HiddenMeta, rank: parallel.Rank
) -> tuple[Any, DFlashObjective]:
    """The target's config and a fresh drafter on the captured layers with the target's frozen
    embedding and LM head, refused before any training when the features hold no hidden states
    or the SGLang release it is for could not serve its rope scaling."""
    if meta.store == "none":
        raise StageError(
            "extract.store: none stores token ids only; DFlash trains on stored features "
            "(set extract.store to all or supervised)"
        )
    if p.mask_token_id is None:
        raise StageError(
            "dflash.mask_token_id: null; name a token id of the target's vocabulary that "
            "generation never emits (a reserved or padding token)"
        )
    target_config = serving_target(target)
    with params_key("dflash.draft"):
        cfg = DFlashConfig.from_target(
            target_config,
            num_hidden_layers=p.num_layers,
            block_size=p.block_size,
            mask_token_id=p.mask_token_id,
            aux_hf_indices=meta.aux_hf_indices,
            **p.draft,
        )
    refuse_unservable_rope(cfg.rope_scaling, p.sglang_version, "dflash")
    embed, head = embedding_and_head(target.path)
    drafter = DFlashDrafter(cfg)
    # each rank draws its own anchors
    seed = p.seed * 1_000_003 + rank.rank
    return target_config, DFlashObjective(drafter, embed, head, p.num_anchors, p.decay_gamma, seed)


def _export_best(
    drafter: DFlashDrafter,
    checkpoint_dir: Path,
    out_dir: Path,
    target_config: Any,
    p: DFlashParams,
    meta: hidden.HiddenMeta,
) -> None:
    """Export the best checkpoint, checked as SGLang loads it, and its layers checked to be the
    ones extract captured (the features it was trained on)."""
    drafter.load_state_dict(best_checkpoint(checkpoint_dir)["model"])
    with params_key("dflash.sglang_version"):
        export_dflash(drafter.cpu(), out_dir, target_config, sglang_version=p.sglang_version)
        check_export(out_dir, target_config, sglang_version=p.sglang_version)
    served = read_exported_config(out_dir)[PROJECT_KEY]["target_hf_indices"]
    if served != list(meta.aux_hf_indices):
        raise StageError(
            f"{out_dir}: SGLang would capture HF hidden states {served}, the drafter was "
            f"trained on {list(meta.aux_hf_indices)} (data/hidden/meta.json); rerun extract"
        )


def _write_reports(
    history: History,
    s: TrainingSettings,
    cfg: DFlashConfig,
    run: tuple[int, bool, float],
    report: Path,
    plots: Path,
) -> None:
    """reports/train_dflash.json and the `dvc plots` CSVs; the best evaluation's figures are
    those of the exported checkpoint. `run`: the world size, whether the steps ran compiled,
    and the seconds the run took."""
    world, compiled, seconds = run
    best = history.best(DFlashObjective.ACCEPTANCE)
    metrics = TrainDFlashReport(
        steps=s.total_steps,
        final_loss=history.steps[-1]["loss"],
        best_step=best["step"] if best else None,
        best_tau=best["tau"] if best else None,
        best_accuracy=best["accuracy"] if best else [],
        block_size=cfg.block_size,
        target_layer_ids=list(cfg.target_layer_ids),
        world_size=world,
        compiled=compiled,
        **history.speed(),
        seconds=round(seconds, 1),
    )
    metrics.write(report)
    write_csv(history.steps, plots / f"{STAGE}_loss.csv")
    evals = [{"step": e["step"], "tau": e["tau"]} for e in history.evals]
    write_csv(evals, plots / f"{STAGE}_evals.csv", ["step", "tau"])
    accuracy = [{"position": k + 1, "accuracy": a} for k, a in enumerate(metrics.best_accuracy)]
    write_csv(accuracy, plots / f"{STAGE}_accuracy.csv", ["position", "accuracy"])
    print(summary(STAGE, metrics.to_json()))


if __name__ == "__main__":
    run(main)
