"""The DFlash stage end to end on the demo target at tiny sizes: features extracted as the extract
stage writes them, trained by the shared loop (an exact resume after a kill at a checkpoint,
the anchor generator's state included), exported and loaded back through the export's check."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from transformers import AutoConfig

from stages import train_dflash
from stages.artifacts.hidden import HiddenStates, collate
from stages.dflash.export import check_export
from stages.dflash.model import DFlashConfig, DFlashDrafter
from stages.dflash.objective import DFlashObjective
from stages.drafter.training import TrainingSettings, train
from stages.extract import extract
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.reports.train_dflash import TrainDFlashReport
from stages.target_model.weights import embedding_and_head
from tests.conftest import DEMO_TARGET
from tests.runtime.test_distributed import write_merged
from tests.stages.test_extract_train import KilledAfter

LAYERS = [2, 4, 5]  # HF hidden-state indices: SGLang's target_layer_ids [1, 3, 4]
TARGET = TargetParams(path=str(DEMO_TARGET), device="cpu", dtype="float32", cpu_threads=1)
MASK = 14  # the demo target's [PAD]
DFLASH = {
    "block_size": 4,
    "num_anchors": 3,
    "decay_gamma": 2.0,
    "mask_token_id": MASK,
    "max_steps": 6,
    "batch_size": 2,
    "eval_every": 2,
    "eval_max_samples": 3,
    "checkpoint_every": 3,
    "lr": 1e-2,
    "device": "cpu",
    "cpu_threads": 1,
}


@pytest.fixture(scope="module")
def hidden_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dflash")
    params = ExtractParams(layers=LAYERS, shard_tokens=120, batch_tokens=256, dtype="float32")
    extract(write_merged(tmp / "merged"), tmp / "hidden", params, TARGET)
    return tmp / "hidden"


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


def test_the_stage_trains_exports_and_reports(hidden_dir, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"target": {"path": str(DEMO_TARGET)}, "dflash": DFLASH}))
    out, report, plots = tmp_path / "models" / "dflash", tmp_path / "report.json", tmp_path / "p"
    train_dflash.main(hidden_dir, tmp_path / "ckpt", out, report, plots, params=params)
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
