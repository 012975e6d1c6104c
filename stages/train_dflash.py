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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .artifacts import hidden
from .cli import PathOpt, StageError, params_key, run, summary
from .dflash.export import check_export, export_dflash
from .dflash.layers import hf_indices_read
from .dflash.model import DFlashConfig, DFlashDrafter
from .dflash.objective import DFlashObjective
from .drafter.export import CONFIG_FILE, PROJECT_KEY, read_exported_config
from .drafter.training import History, TrainingSettings, compiles, train
from .params.dflash import DFlashParams
from .params.extract import ExtractParams
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .reports.train_dflash import TrainDFlashReport
from .runtime import parallel
from .runtime.device import resolve_device
from .runtime.files import remove_path, write_csv, write_json
from .runtime.outputs import empty_dir
from .target_model.weights import embedding_and_head
from .wiring.drafter_run import (
    ONLINE,
    best_checkpoint,
    checkpoint_identity,
    complete_run,
    family_layers,
    feature_source,
    features_identity,
    features_origin,
    guarded_outputs,
    loop_settings,
    prepare,
    refuse_unservable_rope,
    serving_target,
    start_run,
    verified_splits,
)
from .wiring.online_features import online_features

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
    extract = ExtractParams.read(params)  # online: its engine
    rank, device = parallel.start(resolve_device(p.device))
    meta = hidden.read_meta(hidden_dir)
    if meta.layers_for("dflash") is None:
        if rank.main:  # outside the checkpoint folder's lock, which removes a folder left empty
            _not_trained(hidden_dir, checkpoint_dir, out_dir, report, plots)
        parallel.stop()
        return
    with guarded_outputs(STAGE, rank, checkpoint_dir, out_dir, report, plots / f"{STAGE}_loss.csv"):
        started = time.monotonic()
        prepare(p, "dflash", rank, device)
        run = _train(p, target, extract, meta, rank, device, hidden_dir, checkpoint_dir)
        if rank.main:
            _export_best(run.objective.drafter, checkpoint_dir, out_dir, run.target_config, p)
            seconds = time.monotonic() - started
            _write_reports(run, (rank.world, seconds), report, plots)
            complete_run(checkpoint_dir)
    parallel.stop()


@dataclass(frozen=True)
class Run:
    """A finished training run: what its export and reports are written from."""

    objective: DFlashObjective
    target_config: Any
    settings: TrainingSettings
    history: History
    features_from: str  # STORED, or "online <engine>"
    compiled: bool


def _train(
    p: DFlashParams,
    target: TargetParams,
    extract: ExtractParams,
    meta: hidden.HiddenMeta,
    rank: parallel.Rank,
    device: torch.device,
    hidden_dir: Path,
    checkpoint_dir: Path,
) -> Run:
    """The drafter on the features of its own layers (stored, or the target's on each batch
    when extract stored none), resumed from checkpoint_dir when it belongs to this run."""
    layers = _layers(p, meta, hidden_dir)
    target_config, objective = _objective(p, target, layers, rank)
    features = online_features(extract, target, meta, device, layers, rank.rank, rank.world)
    online = features is not None
    train_set, eval_set = verified_splits(hidden_dir, p.max_length, rank, layers)
    s = loop_settings(p, len(train_set), TrainingSettings)
    start_run(STAGE, checkpoint_dir, checkpoint_identity(p, features_identity(meta, layers)), rank)
    if rank.main:
        print(
            f"[{STAGE}] {len(train_set)} train / {len(eval_set)} eval samples, "
            f"{s.total_steps} steps, blocks of {p.block_size}, target layers "
            f"{list(objective.drafter.cfg.target_layer_ids)}, draft "
            f"{sum(x.numel() for x in objective.drafter.parameters()):,} parameters on "
            f"{device} x {rank.world}" + (ONLINE if online else "")
        )
    history = train(
        objective,
        train_set,
        eval_set,
        s,
        checkpoint_dir,
        device,
        rank,
        features=features,
        stage=STAGE,
    )
    features_from = features_origin(meta)
    compiled = compiles(s.compile, device) and history.compile_failed_at is None
    return Run(objective, target_config, s, history, features_from, compiled)


def _layers(p: DFlashParams, meta: hidden.HiddenMeta, hidden_dir: Path) -> list[int]:
    """The HF indices DFlash reads of the features, refused when they are not the ones the
    `dflash` section asks for (the section changed since extract ran)."""
    captured = family_layers(meta, "dflash", hidden_dir)
    with params_key("dflash.target_layer_ids"):
        wanted = hf_indices_read(p.target_layer_ids, meta.num_hidden_layers, p.num_layers)
    if captured != wanted:
        raise StageError(
            f"{hidden_dir / hidden.META}: DFlash's features are HF hidden states {captured}, the "
            f"dflash section reads HF hidden states {wanted}; rerun extract"
        )
    return captured


def _not_trained(
    hidden_dir: Path, checkpoint_dir: Path, out_dir: Path, report: Path, plots: Path
) -> None:
    """extract.drafters leaves DFlash out: no drafter (an empty models/dflash, which the
    benchmark and report stages read as not trained), the reason in the report, empty curves.
    The checkpoints stay: adding DFlash back resumes them when nothing else changed."""
    reason = f"extract.drafters leaves out dflash ({hidden_dir / hidden.META})"
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    remove_path(out_dir / CONFIG_FILE)  # first: an export cut short here reads as none
    empty_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json({"trained": False, "reason": reason}, report)
    for name, columns in CURVES.items():
        write_csv([], plots / f"{STAGE}_{name}.csv", columns)
    print(f"[{STAGE}] not trained: {reason}")


def _objective(
    p: DFlashParams, target: TargetParams, layers: list[int], rank: parallel.Rank
) -> tuple[Any, DFlashObjective]:
    """The target's config and a fresh drafter on the target's HF hidden states `layers` with
    the target's frozen embedding and LM head, refused before any training when the SGLang
    release it is for could not serve its rope scaling."""
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
            aux_hf_indices=layers,
            **p.draft,
        )
    refuse_unservable_rope(cfg.rope_scaling, p.sglang_version, "dflash")
    embed, head = embedding_and_head(target.path)
    drafter = DFlashDrafter(cfg)
    # each rank draws its own anchors
    seed = p.seed * 1_000_003 + rank.rank
    return target_config, DFlashObjective(drafter, embed, head, p.num_anchors, p.decay_gamma, seed)


def _export_best(
    drafter: DFlashDrafter, checkpoint_dir: Path, out_dir: Path, target_config: Any, p: DFlashParams
) -> None:
    """Export the best checkpoint, checked as SGLang loads it, and its layers checked to be the
    ones it was trained on."""
    drafter.load_state_dict(best_checkpoint(checkpoint_dir)["model"])
    with params_key("dflash.sglang_version"):
        export_dflash(drafter.cpu(), out_dir, target_config, sglang_version=p.sglang_version)
        check_export(out_dir, target_config, sglang_version=p.sglang_version)
    served = read_exported_config(out_dir)[PROJECT_KEY]["target_hf_indices"]
    trained_on = list(drafter.cfg.hf_indices)
    if served != trained_on:
        raise StageError(
            f"{out_dir}: SGLang would capture HF hidden states {served}, the drafter was "
            f"trained on {trained_on}; rerun train_dflash"
        )


# the `dvc plots` CSVs: their columns
CURVES = {"loss": ["step", "loss"], "evals": ["step", "tau"], "accuracy": ["position", "accuracy"]}


def _write_reports(run: Run, facts: tuple[int, float], report: Path, plots: Path) -> None:
    """reports/train_dflash.json and the `dvc plots` CSVs; the best evaluation's figures are
    those of the exported checkpoint. `facts`: the world size and the seconds the run took."""
    world, seconds = facts
    history, cfg = run.history, run.objective.drafter.cfg
    best = history.best(DFlashObjective.ACCEPTANCE)
    metrics = TrainDFlashReport(
        steps=run.settings.total_steps,
        final_loss=history.steps[-1]["loss"],
        best_step=best["step"] if best else None,
        best_tau=best["tau"] if best else None,
        best_accuracy=best["accuracy"] if best else [],
        block_size=cfg.block_size,
        target_layer_ids=list(cfg.target_layer_ids),
        world_size=world,
        compiled=run.compiled,
        **history.speed(),
        **feature_source(history, run.features_from),
        seconds=round(seconds, 1),
    )
    metrics.write(report)
    write_csv(history.steps, plots / f"{STAGE}_loss.csv")
    evals = [{"step": e["step"], "tau": e["tau"]} for e in history.evals]
    write_csv(evals, plots / f"{STAGE}_evals.csv", CURVES["evals"])
    accuracy = [{"position": k + 1, "accuracy": a} for k, a in enumerate(metrics.best_accuracy)]
    write_csv(accuracy, plots / f"{STAGE}_accuracy.csv", CURVES["accuracy"])
    print(summary(STAGE, metrics.to_json()))


if __name__ == "__main__":
    run(main)
