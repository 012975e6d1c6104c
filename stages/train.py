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
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from .artifacts import hidden
from .artifacts.hidden import HiddenStates
from .cli import PathOpt, StageError, params_key, run, summary
from .drafter.export import check_export, export_drafter
from .drafter.knobs import LoopKnobs
from .drafter.layers import parse_version
from .drafter.model import Eagle3Config, Eagle3Drafter, rope_serving_problem
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
from .reports.train import STORED, TrainReport
from .runtime import parallel
from .runtime.device import resolve_device, set_cpu_threads
from .runtime.fields import speed_only_keys
from .runtime.files import ChecksumError, remove_path, verify_checksum, write_csv, write_json
from .runtime.outputs import LOCK_NAME, output_lock, remove_stale_temps, remove_stale_temps_around
from .runtime.swap import OWN, drop_aside, finish_swap, keep_aside
from .target_model.weights import embedding_and_head
from .wiring.online_features import online_features


def build_drafter(
    target_config, meta: hidden.HiddenMeta, vocab_file: Path, draft: dict
) -> Eagle3Drafter:
    vocab = load_file(str(vocab_file))
    cfg = Eagle3Config.from_target(
        target_config, int(vocab["d2t"].numel()), meta.aux_hf_indices, **draft
    )
    drafter = Eagle3Drafter(cfg)
    drafter.set_vocab(vocab["d2t"], vocab["t2d"])
    return drafter


def settings(p: TrainParams, train_samples: int) -> LoopSettings:
    """The loop's settings: the knobs as params set them, and the steps derived from the keys."""
    steps_per_epoch = math.ceil(train_samples / p.batch_size)
    total = p.max_steps or max(1, math.ceil(steps_per_epoch * p.epochs))
    knobs = {f.name: getattr(p, f.name) for f in dataclasses.fields(LoopKnobs)}
    return LoopSettings(
        **knobs,
        total_steps=total,
        warmup_steps=max(1, int(total * p.warmup_ratio)),
        compile=p.compile is not False,
    )


# Params that change how fast a run computes, not what it trains: changing them resumes the run.
SPEED_ONLY = speed_only_keys(TrainParams)

# The evaluations' figures per step, for the report and `dvc plots`
EVAL_COLUMNS = ("step", "replayed_tau", "simulated_tau")
# What a checkpoint holds; raise it when that changes (2: evaluations carry replayed_tau; 3:
# a size and sha256 beside each), so that older checkpoints start the run over instead of failing
# to resume.
CHECKPOINT_FORMAT = 3


def run_identity(p: TrainParams, features: str, vocab_file: Path) -> dict:
    """What checkpoints belong to: the params that change the drafter (all but SPEED_ONLY), the
    features' fingerprint and the vocabulary file's hash."""
    return {
        "train": {k: v for k, v in p.__dict__.items() if k not in SPEED_ONLY},
        "hidden": features,
        "vocab": hashlib.sha256(vocab_file.read_bytes()).hexdigest()[:16],
    }


EARLIER = "earlier"  # in the checkpoint folder: another run's checkpoints, kept aside


def start_or_resume(checkpoint_dir: Path, run: dict) -> None:
    """Keep checkpoints only when they belong to this exact run (params, features, vocab) and
    were written in this checkpoint format; drop what a killed run left half-written. Another
    run's checkpoints are kept aside in `earlier/` until this run completes (a run that fails
    leaves them), and come back when the params are set back to theirs. A swap that a kill cut
    short is finished first, so each run's checkpoints are whole again."""
    run = {"checkpoint_format": CHECKPOINT_FORMAT, **run}
    remove_stale_temps(checkpoint_dir)  # a killed run's half-saved checkpoint or journal
    finish_swap(checkpoint_dir)
    run_file, aside = checkpoint_dir / "run.json", checkpoint_dir / EARLIER
    if run_file.exists() and not _same_run(run_file, run):
        if _same_run(aside / "run.json", run):
            print(f"[train] the params are the earlier run's again: resuming it from {aside}")
            _keep_aside(checkpoint_dir, aside, back=True)
        else:
            print(
                f"[train] params, features, vocab or checkpoint format changed: starting over "
                f"in {checkpoint_dir}, the earlier checkpoints kept in {aside} until this run "
                f"completes"
            )
            _keep_aside(checkpoint_dir, aside, back=False)
    write_json(run, run_file)


def _same_run(run_file: Path, run: dict) -> bool:
    return run_file.exists() and json.loads(run_file.read_text()) == json.loads(json.dumps(run))


def _keep_aside(checkpoint_dir: Path, aside: Path, back: bool) -> None:
    """Put the folder's run aside (replacing one kept there), or, `back`, swap it with the one
    aside, journaled (runtime/swap.py): a kill at any point of it leaves both runs to resume. A
    run with no checkpoint yet (it failed before its first) has nothing to keep: it is dropped,
    and a run already aside stays there."""
    skip = {LOCK_NAME, EARLIER, *OWN}
    here = [p for p in checkpoint_dir.iterdir() if p.name not in skip]
    if not any(p.suffix == ".pt" for p in here):
        for p in here:
            remove_path(p)
        here = []
    if here or back:
        keep_aside(checkpoint_dir, aside, [p.name for p in here], back)


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
    # rank 0 holds the checkpoint folder's lock for the whole run: a second training writing the
    # same checkpoints is refused
    with (
        output_lock(checkpoint_dir, "train") if rank.main else contextlib.nullcontext(),
        parallel.collective_failures_named(rank),
    ):
        if rank.main:
            # what a killed run left half-written: checkpoints, `models/.drafter.tmp-<pid>`,
            # reports and plots
            remove_stale_temps_around(checkpoint_dir, out_dir, report, plots / "train_loss.csv")
        try:
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
        except ChecksumError as err:
            raise StageError(
                f"{err}; a shard: rerun extract (it extracts a damaged shard again); a "
                f"checkpoint: delete it to train from the start, or restore it"
            ) from None
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
    _prepare(p, rank, device)
    meta = hidden.read_meta(hidden_dir)
    target_config, drafter = _servable_drafter(p, target, meta, vocab_file)
    embed, head = embedding_and_head(target.path)
    online = meta.store == "none"
    features = (
        online_features(extract, target, meta, device, rank.rank, rank.world) if online else None
    )
    train_set, eval_set = _verified_splits(hidden_dir, p.max_length, rank)
    s = settings(p, len(train_set))
    if rank.main:
        start_or_resume(checkpoint_dir, run_identity(p, meta.fingerprint, vocab_file))
    if rank.world > 1:
        torch.distributed.barrier()
    if rank.main:
        print(
            f"[train] {len(train_set)} train / {len(eval_set)} eval samples, "
            f"{s.total_steps} steps, draft {sum(x.numel() for x in drafter.parameters()):,} "
            f"parameters on {device} x {rank.world}"
            + (", features from the target on each batch (extract.store none)" if online else "")
        )
    objective = Objective(drafter, embed, head, p.ttt_steps, p.decay)
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
        features_from = f"online {meta.engine or 'hf'}" if online else STORED
        compiled = compiles(s.compile, device) and history.compile_failed_at is None
        _write_reports(history, s, p, (rank.world, features_from, compiled), report, plots)
        drop_aside(checkpoint_dir, checkpoint_dir / EARLIER)  # this run is complete


def _prepare(p: TrainParams, rank: parallel.Rank, device: torch.device) -> None:
    """The process's threads and seed, and a batch that splits over the ranks."""
    if device.type == "cpu":
        set_cpu_threads(p.cpu_threads)
    if p.batch_size % rank.world:
        raise StageError(
            f"train.batch_size: {p.batch_size} samples do not split evenly over "
            f"{rank.world} processes; use a multiple of {rank.world}"
        )
    torch.manual_seed(p.seed)


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
    p: TrainParams, target: TargetParams, meta: hidden.HiddenMeta, vocab_file: Path
) -> tuple[Any, Eagle3Drafter]:
    """The target's config and a fresh drafter shaped for it, refused before any training when
    the SGLang version it is for could not serve its rope scaling."""
    target_config = AutoConfig.from_pretrained(
        target.path, local_files_only=True, trust_remote_code=target.trust_remote_code
    )
    with params_key("train.draft"):
        drafter = build_drafter(target_config, meta, vocab_file, p.draft)
    with params_key("train.sglang_version"):
        version = parse_version(p.sglang_version) if p.sglang_version else None
    if problem := rope_serving_problem(drafter.cfg.rope_scaling, version):
        raise StageError(f"train.draft / train.sglang_version: {problem}")
    return target_config, drafter


def _verified_splits(
    hidden_dir: Path, max_length: int, rank: parallel.Rank
) -> tuple[HiddenStates, HiddenStates]:
    """The train and eval splits, every shard checked to be the file extract wrote (size and
    sha256) before a step uses it; each rank reads its share once."""
    train_set = HiddenStates(hidden_dir, "train", max_length)
    eval_set = HiddenStates(hidden_dir, "eval", max_length)
    if not len(train_set):
        raise StageError(f"{hidden_dir / hidden.INDEX}: no train samples; check extract.splits")
    shards = sorted({r["shard"] for r in train_set.rows + eval_set.rows})
    hidden.verify_shards(hidden_dir, shards[rank.rank :: rank.world])
    return train_set, eval_set


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
    best_path = checkpoint_dir / "best.pt"
    chosen = best_path if best_path.exists() else checkpoint_dir / "last.pt"
    verify_checksum(chosen)
    best = torch.load(chosen, map_location="cpu", weights_only=True)
    drafter.load_state_dict(best["model"])
    with params_key("train.sglang_version"):
        export_drafter(
            drafter.cpu(),
            drafter.cfg,
            out_dir,
            target_config,
            extra={"training": p.__dict__, "hidden_meta": meta.to_json()},
            sglang_version=p.sglang_version,
        )
        check_export(out_dir, target_config, meta.aux_hf_indices, sglang_version=p.sglang_version)


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
    best_eval = max(history.evals, key=lambda e: e["replayed_tau"], default=None)
    metrics = TrainReport(
        steps=s.total_steps,
        final_loss=history.steps[-1]["loss"],
        best_step=best_eval["step"] if best_eval else None,
        best_replayed_tau=best_eval["replayed_tau"] if best_eval else None,
        best_simulated_tau=best_eval["simulated_tau"] if best_eval else None,
        eval_num_steps=p.eval_num_steps,
        world_size=world,
        tokens_per_s=round(history.tokens_per_s, 1),
        warmup_s=round(history.warmup_seconds, 1),
        padding_share=round(history.padding_share, 4),
        compiled=compiled,
        compile_failed_at_step=history.compile_failed_at,
        features=features_from,
        target_forward_share=None if features_from == STORED else round(history.target_share, 4),
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
