"""train: the EAGLE-3 drafter on the extracted hidden states, then its export.

Reads params `train` (and the target path from `target`; with `extract.store: none`, the
engine's settings from `extract`). Resumes from
models/checkpoints/last.pt; keeps models/checkpoints/best.pt by replayed acceptance length on the
eval split; exports the best to models/drafter/ in SGLang's LlamaForCausalLMEagle3 format
(checked key by key). Writes reports/train.json, reports/plots/train_loss.csv,
reports/plots/train_evals.csv (replayed and simulated tau per evaluation) and
reports/plots/train_acceptance.csv. Under torchrun it trains data-parallel (DDP).

With `extract.store: none` (meta.json's `store`) the shards hold token ids only: the target runs
here and gives each batch its features (`wiring.online_features.online_features`): with the hf
engine a whole target on each rank's device beside the drafter; with sglang SGLang's model runner,
tensor parallel over the same torchrun ranks that train the drafter data-parallel, each forward
taking every rank's batch. tokens/s in reports/train.json then include its forward, and
`target_forward_share` says how much of the step time it took (meta.json, with its `store`, is in
models/drafter/training_args.json).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from .artifacts import hidden
from .cli import PathOpt, params_key, run, summary
from .drafter.checkpoints import CHECKPOINT_FORMAT as CHECKPOINT_FORMAT  # read here by tests
from .drafter.checkpoints import EARLIER as EARLIER
from .drafter.checkpoints import start_or_resume as start_or_resume
from .drafter.export import check_export, export_drafter
from .drafter.model import Eagle3Config, Eagle3Drafter
from .drafter.training import (
    History,
    LoopSettings,
    Objective,
    compiles,
    train,
)
from .params.extract import ExtractParams
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .params.train import TrainParams
from .reports.train import TrainReport
from .runtime import parallel
from .runtime.device import resolve_device
from .runtime.fields import speed_only_keys
from .runtime.files import write_csv
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


def build_drafter(target_config, layers: list[int], vocab_file: Path, draft: dict) -> Eagle3Drafter:
    """A fresh drafter reading the target's HF hidden states `layers`."""
    vocab = load_file(str(vocab_file))
    cfg = Eagle3Config.from_target(target_config, int(vocab["d2t"].numel()), layers, **draft)
    drafter = Eagle3Drafter(cfg)
    drafter.set_vocab(vocab["d2t"], vocab["t2d"])
    return drafter


def settings(p: TrainParams, train_samples: int) -> LoopSettings:
    """The loop's settings with the TTT objective's knobs, as params set them."""
    return loop_settings(p, train_samples, LoopSettings)


# Params that change how fast a run computes, not what it trains: changing them resumes the run.
SPEED_ONLY = speed_only_keys(TrainParams)

# The evaluations' figures per step, for the report and `dvc plots`
EVAL_COLUMNS = ("step", "replayed_tau", "simulated_tau")


def run_identity(p: TrainParams, features: str, vocab_file: Path) -> dict:
    """What checkpoints belong to: the params that change the drafter (all but SPEED_ONLY), the
    features' fingerprint and the vocabulary file's hash."""
    vocab = hashlib.sha256(vocab_file.read_bytes()).hexdigest()[:16]
    return {**checkpoint_identity(p, features), "vocab": vocab}


def main(
    hidden_dir: PathOpt,
    vocab_file: PathOpt,
    checkpoint_dir: PathOpt,
    out_dir: PathOpt,
    report: PathOpt,
    plots: PathOpt,
    live: Path | None = None,
    params: Path = PARAMS_FILE,
) -> None:
    """Train the drafter (torchrun for several GPUs) and export the best checkpoint."""
    p = TrainParams.read(params)
    target = TargetParams.read(params)
    extract = ExtractParams.read(params)  # online: its engine
    rank, device = parallel.start(resolve_device(p.device))
    with guarded_outputs("train", rank, checkpoint_dir, out_dir, report, plots / "train_loss.csv"):
        _train(
            p,
            target,
            extract,
            rank,
            device,
            hidden_dir,
            vocab_file,
            checkpoint_dir,
            out_dir,
            report,
            plots,
            live,
        )
    parallel.stop()


def _train(
    p: TrainParams,
    target: TargetParams,
    extract: ExtractParams,
    rank: parallel.Rank,
    device: torch.device,
    hidden_dir: Path,
    vocab_file: Path,
    checkpoint_dir: Path,
    out_dir: Path,
    report: Path,
    plots: Path,
    live: Path | None,
) -> None:
    prepare(p, "train", rank, device)
    meta = hidden.read_meta(hidden_dir)
    layers = family_layers(meta, "eagle3", hidden_dir)
    target_config, drafter = _servable_drafter(p, target, layers, vocab_file)
    embed, head = embedding_and_head(target.path)
    features = online_features(extract, target, meta, device, layers, rank.rank, rank.world)
    online = features is not None
    train_set, eval_set = verified_splits(hidden_dir, p.max_length, rank, layers)
    s = settings(p, len(train_set))
    identity = run_identity(p, features_identity(meta, layers), vocab_file)
    start_run("train", checkpoint_dir, identity, rank)
    if rank.main:
        print(
            f"[train] {len(train_set)} train / {len(eval_set)} eval samples, "
            f"{s.total_steps} steps, draft {sum(x.numel() for x in drafter.parameters()):,} "
            f"parameters on {device} x {rank.world}" + (ONLINE if online else "")
        )
    objective = Objective(drafter, embed, head, s.ttt_steps, s.decay, s.eval_num_steps)
    resumed = (checkpoint_dir / "last.pt").exists()
    with live_log(live if rank.main else None, resumed) as observe:
        history = train(
            objective,
            train_set,
            eval_set,
            s,
            checkpoint_dir,
            device,
            rank,
            features=features,
            observe=observe,
        )
    if rank.main:
        _export_best(drafter, checkpoint_dir, out_dir, target_config, p, meta)
        features_from = features_origin(meta)
        compiled = compiles(s.compile, device) and history.compile_failed_at is None
        _write_reports(history, s, p, (rank.world, features_from, compiled), report, plots)
        complete_run(checkpoint_dir)


@contextlib.contextmanager
def live_log(
    live: Path | None, resumed: bool
) -> Iterator[Callable[[int, dict[str, float]], None] | None]:
    """The run's figures logged with DVCLive as it trains: `live`/metrics.json (what `dvc exp
    show` shows of a running experiment, and DVC Studio live) and `live`/plots/metrics/ (what
    `dvc plots diff` compares), continued when the run resumes. None: no live log."""
    if live is None:
        yield None
        return
    from dvclive import Live

    with Live(str(live), resume=resumed, save_dvc_exp=False, dvcyaml=False) as logger:

        def observe(step: int, figures: dict[str, float]) -> None:
            logger.step = step
            for name, value in figures.items():
                logger.log_metric(name, value)
            logger.next_step()

        yield observe


def _servable_drafter(
    p: TrainParams, target: TargetParams, layers: list[int], vocab_file: Path
) -> tuple[Any, Eagle3Drafter]:
    """The target's config and a fresh drafter shaped for it, refused before any training when
    the SGLang version it is for could not serve its rope scaling."""
    target_config = serving_target(target)
    with params_key("train.draft"):
        drafter = build_drafter(target_config, layers, vocab_file, p.draft)
    refuse_unservable_rope(drafter.cfg.rope_scaling, p.sglang_version, "train")
    return target_config, drafter


def _export_best(
    drafter: Eagle3Drafter,
    checkpoint_dir: Path,
    out_dir: Path,
    target_config: Any,
    p: TrainParams,
    meta: hidden.HiddenMeta,
) -> None:
    """Export the best checkpoint (the last when there was nothing to evaluate), not the drafter
    as training left it; checked before the stage ends, so that no engine loads it wrongly."""
    drafter.load_state_dict(best_checkpoint(checkpoint_dir)["model"])
    with params_key("train.sglang_version"):
        export_drafter(
            drafter.cpu(),
            drafter.cfg,
            out_dir,
            target_config,
            extra={"training": p.__dict__, "hidden_meta": meta.to_json()},
            sglang_version=p.sglang_version,
        )
        trained_on = list(drafter.cfg.aux_layer_ids)
        check_export(out_dir, target_config, trained_on, sglang_version=p.sglang_version)


def _write_reports(
    history: History,
    s: LoopSettings,
    p: TrainParams,
    run: tuple[int, str, bool],
    report: Path,
    plots: Path,
) -> None:
    """reports/train.json and the `dvc plots` CSVs; the best evaluation's figures are those of
    the exported checkpoint. `run`: the world size, where the features came from ("stored":
    shards, or "online <engine>": the target ran on each batch, and the share of the step time
    its forward took is reported) and whether the steps ran compiled."""
    world, features_from, compiled = run
    best_eval = history.best("replayed_tau")
    metrics = TrainReport(
        steps=s.total_steps,
        final_loss=history.steps[-1]["loss"],
        best_step=best_eval["step"] if best_eval else None,
        best_replayed_tau=best_eval["replayed_tau"] if best_eval else None,
        best_simulated_tau=best_eval["simulated_tau"] if best_eval else None,
        eval_num_steps=p.eval_num_steps,
        world_size=world,
        compiled=compiled,
        **history.speed(),
        **feature_source(history, features_from),
    )
    metrics.write(report)
    write_csv(history.steps, plots / "train_loss.csv")
    write_csv(
        [{k: e[k] for k in EVAL_COLUMNS} for e in history.evals],
        plots / "train_evals.csv",
        list(EVAL_COLUMNS),
    )
    if best_eval:
        write_csv(
            [
                {
                    "position": k + 1,
                    "accuracy": best_eval["accuracy"][k],
                    "conditional": best_eval["acceptance_conditional"][k],
                    "unconditional": best_eval["acceptance_unconditional"][k],
                }
                for k in range(p.ttt_steps)
            ],
            plots / "train_acceptance.csv",
        )
    print(summary("train", metrics.to_json()))


if __name__ == "__main__":
    run(main)
