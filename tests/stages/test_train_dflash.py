"""The DFlash stage end to end on the demo target at tiny sizes: features extracted as the extract
stage writes them, trained by the shared loop (an exact resume after a kill at a checkpoint,
the anchor generator's state included), exported and loaded back through the export's check."""

from __future__ import annotations

import csv
import json

import pytest
import torch
import yaml
from transformers import AutoConfig

from stages import train_dflash
from stages.artifacts.hidden import HiddenStates, collate
from stages.cli import StageError
from stages.dflash.export import check_export
from stages.dflash.model import DFlashConfig, DFlashDrafter
from stages.dflash.objective import DFlashObjective
from stages.drafter.training import TrainingSettings, train
from stages.extract import extract
from stages.params.dflash import DFlashParams
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.reports.train_dflash import TrainDFlashReport
from stages.target_model.weights import embedding_and_head
from tests.conftest import DEMO_TARGET
from tests.runtime.test_distributed import write_merged
from tests.stages.test_extract_train import KilledAfter

LAYERS = [2, 4, 5]  # HF hidden-state indices: SGLang's target_layer_ids [1, 3, 4]
IDS = [1, 3, 4]
TARGET = TargetParams(path=str(DEMO_TARGET), device="cpu", dtype="float32", cpu_threads=1)
MASK = 14  # the demo target's [PAD]
DFLASH = {
    "block_size": 4,
    "num_anchors": 3,
    "decay_gamma": 2.0,
    "mask_token_id": MASK,
    "target_layer_ids": IDS,
    "max_steps": 6,
    "batch_size": 2,
    "eval_every": 2,
    "eval_max_samples": 3,
    "checkpoint_every": 3,
    "lr": 1e-2,
    "device": "cpu",
    "cpu_threads": 1,
}


def extracted(tmp, drafters: list[str], store: str = "all"):
    """The demo's features for `drafters` (DFlash reading the layers EAGLE-3 does)."""
    params = ExtractParams(
        drafters=drafters,
        layers=LAYERS,
        shard_tokens=120,
        batch_tokens=256,
        dtype="float32",
        store=store,
    )
    merged = tmp / "merged"
    if not merged.exists():
        write_merged(merged)
    out = tmp / f"hidden-{'-'.join(drafters)}-{store}"
    extract(merged, out, params, TARGET, dflash=DFlashParams(target_layer_ids=IDS))
    return out


@pytest.fixture(scope="module")
def hidden_dir(tmp_path_factory):
    return extracted(tmp_path_factory.mktemp("dflash"), ["eagle3", "dflash"])


def objective() -> DFlashObjective:
    target_config = AutoConfig.from_pretrained(DEMO_TARGET, local_files_only=True)
    cfg = DFlashConfig.from_target(
        target_config, num_hidden_layers=1, block_size=4, mask_token_id=MASK, aux_hf_indices=LAYERS
    )
    torch.manual_seed(0)
    embed, head = embedding_and_head(DEMO_TARGET)
    return DFlashObjective(DFlashDrafter(cfg), embed, head, num_anchors=3, decay_gamma=2.0)


def settings() -> TrainingSettings:
    return TrainingSettings(
        total_steps=6,
        warmup_steps=1,
        batch_size=2,
        lr=1e-2,
        eval_every=2,
        eval_max_samples=3,
        checkpoint_every=3,
        length_window=2,
    )


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_drafter(hidden_dir, tmp_path):
    """Killed in step 4, after the step-3 checkpoint: the rerun reads the batches and draws the
    anchors the uninterrupted run did (the generator's state is in the checkpoint), so it ends
    with the same weights, losses and evaluations."""
    train_set, eval_set = HiddenStates(hidden_dir, "train"), HiddenStates(hidden_dir, "eval")
    cpu, quiet = torch.device("cpu"), lambda _: None
    straight = objective()
    history = train(straight, train_set, eval_set, settings(), tmp_path / "a", cpu, log=quiet)
    assert [e["step"] for e in history.evals] == [2, 4, 6]
    assert all(1 <= e["tau"] <= 4 for e in history.evals)  # at most 3 drafts + the target's
    with pytest.raises(KeyboardInterrupt):
        train(objective(), KilledAfter(train_set, 3, 2), eval_set, settings(), tmp_path / "b", cpu)
    resumed = objective()
    again = train(resumed, train_set, eval_set, settings(), tmp_path / "b", cpu, log=quiet)
    assert [r["loss"] for r in again.steps] == [r["loss"] for r in history.steps]
    assert again.evals == history.evals
    for (name, a), (_, b) in zip(
        straight.drafter.state_dict().items(), resumed.drafter.state_dict().items()
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert torch.equal(straight.generator.get_state(), resumed.generator.get_state())
    best = torch.load(tmp_path / "a" / "best.pt", weights_only=True)
    assert best["tau"] == pytest.approx(max(e["tau"] for e in history.evals), abs=1e-4)


def test_evaluations_score_the_same_blocks_and_leave_the_training_draws(hidden_dir):
    eval_set = HiddenStates(hidden_dir, "eval")
    scored = objective()
    batch = collate([eval_set[i] for i in range(len(eval_set))], torch.float32)
    before = scored.generator.get_state()
    with torch.no_grad():
        scored.eval()
        first = scored(batch)[1]
        scored.eval()  # the next evaluation
        second = scored(batch)[1]
    assert torch.equal(first.correct, second.correct) and first.blocks == second.blocks
    assert torch.equal(scored.generator.get_state(), before)


def run_stage(hidden_dir, tmp_path, **dflash):
    """train_dflash on `hidden_dir` with DFLASH's params and `dflash`'s changes: (the export's
    folder, the report, the plots' folder)."""
    tmp_path.mkdir(exist_ok=True)
    params = tmp_path / "params.yaml"
    section = {**DFLASH, **dflash}
    params.write_text(yaml.safe_dump({"target": {"path": str(DEMO_TARGET)}, "dflash": section}))
    out, report, plots = tmp_path / "models" / "dflash", tmp_path / "report.json", tmp_path / "p"
    train_dflash.main(hidden_dir, tmp_path / "ckpt", out, report, plots, params=params)
    return out, report, plots


def test_the_stage_trains_exports_and_reports(hidden_dir, tmp_path):
    out, report, plots = run_stage(hidden_dir, tmp_path)
    target_config = AutoConfig.from_pretrained(DEMO_TARGET, local_files_only=True)
    check_export(out, target_config)
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["target_layer_ids"] == [1, 3, 4]
    assert config["dflash_config"]["mask_token_id"] == MASK
    written = TrainDFlashReport.read(report)
    assert written.steps == 6 and written.best_step in (2, 4, 6)
    assert written.best_tau is not None and 1 <= written.best_tau <= 4
    assert len(written.best_accuracy) == 3 and written.target_layer_ids == [1, 3, 4]
    for name in ("loss", "evals", "accuracy"):
        assert (plots / f"train_dflash_{name}.csv").stat().st_size > 0
    assert written.features == "stored" and written.target_forward_share is None


def test_features_captured_without_dflash_train_nothing_and_say_why(tmp_path):
    """extract.drafters without dflash: an empty export folder (what benchmark_dflash reads as
    not trained) and checkpoint folder, the reason in the report, curves with headers only."""
    hidden = extracted(tmp_path, ["eagle3"])
    stale = tmp_path / "models" / "dflash"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")  # an earlier run's export
    out, report, plots = run_stage(hidden, tmp_path)
    assert out.is_dir() and not any(out.iterdir())
    assert (tmp_path / "ckpt").is_dir()  # DVC records it, empty, as the stage's output
    written = json.loads(report.read_text())
    assert written["trained"] is False and "extract.drafters" in written["reason"]
    assert (plots / "train_dflash_evals.csv").read_text().strip() == "step,tau"


def test_a_dflash_section_the_features_were_not_captured_for_is_refused(hidden_dir, tmp_path):
    """Two draft layers read SGLang's default ids [1, 5] (HF [2, 6]), not the captured [2, 4, 5]:
    the stage stops before training, naming meta.json and what to run."""
    with pytest.raises(StageError, match=r"meta.json.*HF hidden states \[2, 4, 5\].*rerun extract"):
        run_stage(hidden_dir, tmp_path, num_layers=2, target_layer_ids=None)
    assert not (tmp_path / "ckpt" / "last.pt").exists()


@pytest.mark.slow
def test_online_features_train_the_same_drafter_as_stored_ones(tmp_path):
    """extract.store none: the stage runs the target on each batch; its curve is that of the
    features stored the way store none keeps the rows (up to each sample's last supervised
    token), step for step."""
    stored = extracted(tmp_path, ["eagle3", "dflash"], store="supervised")
    online = extracted(tmp_path, ["eagle3", "dflash"], store="none")
    _, stored_report, stored_plots = run_stage(stored, tmp_path / "stored")
    _, online_report, online_plots = run_stage(online, tmp_path / "online")
    assert TrainDFlashReport.read(online_report).features == "online hf"
    curves = [
        [float(r["loss"]) for r in csv.DictReader((p / "train_dflash_loss.csv").open())]
        for p in (stored_plots, online_plots)
    ]
    assert len(curves[0]) == 6
    assert curves[1] == pytest.approx(curves[0], rel=1e-5)
    taus = [TrainDFlashReport.read(r).best_tau for r in (stored_report, online_report)]
    assert taus[1] == pytest.approx(taus[0], rel=1e-5)
