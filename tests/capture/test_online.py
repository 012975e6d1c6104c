"""Online training (`extract.store: none`) beside a tensor-parallel target: the train stage under
torchrun (2 gloo ranks on the CPU) runs the target through the sglang engine, against the
stand-in of a supported release (tests/fake_sglang), and trains the drafter data-parallel over
the same ranks. Its loss curve is offline training's on the same target (hf engine, stored), and
a run killed mid-way resumes exactly."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoConfig

from stages import train as train_stage
from stages.artifacts.hidden import HiddenStates, read_meta
from stages.capture.online import GroupFeatures
from stages.drafter.training import Objective, train
from stages.drafter.vocab import build_draft_vocab
from stages.extract import extract
from stages.params.extract import ExtractParams, ExtractSGLangParams
from stages.params.target import TargetParams
from stages.runtime.parallel import NCCL_ENV
from stages.target_model.weights import embedding_and_head
from stages.wiring.online_features import online_features
from tests import fake_sglang
from tests.conftest import ROOT
from tests.runtime.test_rank_killed import workers
from tests.stages.test_extract_train import KilledAfter, settings

from .conftest import VOCAB, write_merged

LAYERS = [3, 4, 6]
TRAIN = {
    "ttt_steps": 2,
    "max_steps": 8,
    "batch_size": 4,
    "lr": 1e-2,
    "warmup_ratio": 0.25,
    "eval_every": 2,
    "eval_max_samples": 3,  # the second rank has no eval batch: it joins the first's forward
    "checkpoint_every": 2,
    "length_window": 1,
    "device": "cpu",
}


class ListCapture:
    """A Capture over fixed features: sample s of the batch given gets aux = s's ids repeated,
    last = their negatives; it records each batch it was given."""

    aux_indices, hidden_size = [1, 2], 3
    dtype = torch.float32

    def __init__(self):
        self.batches: list[list[list[int]]] = []

    def capture(self, input_ids):
        self.batches.append([list(s) for s in input_ids])
        for pos, ids in enumerate(input_ids):
            x = torch.tensor(ids, dtype=torch.float32)[:, None]
            yield pos, x.expand(-1, 6).clone(), -x.expand(-1, 3).clone()


def test_group_features_fill_each_sample_up_to_its_length_and_leave_padding_zero():
    capture = ListCapture()
    features = GroupFeatures(capture, 0, 1, stored=torch.float32, dtype=torch.float64)
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    batch = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()}
    out = features(batch)
    assert capture.batches == [[[5, 6, 7], [8, 9]]]
    assert out["aux"].dtype == torch.float64 and out["aux"].shape == (2, 3, 6)
    want = torch.tensor([[5.0, 6, 7], [8, 9, 0]], dtype=torch.float64)
    assert torch.equal(out["aux"][..., 0], want) and torch.equal(out["last"][..., 2], -want)
    assert features.seconds > 0
    features.join()  # no samples anywhere: no forward
    assert len(capture.batches) == 1
    # rounded to the stored dtype first, as the shards would hold them: 257 is 256 in bf16
    rounded = GroupFeatures(capture, 0, 1, stored=torch.bfloat16, dtype=torch.float32)
    one = {"input_ids": torch.tensor([[257]]), "attention_mask": torch.tensor([[True]])}
    assert rounded(one)["aux"][0, 0, 0] == 256


def write_vocab(path: Path) -> Path:
    d2t, t2d, _ = build_draft_vocab(torch.ones(VOCAB, dtype=torch.int64), VOCAB)
    save_file({"d2t": d2t, "t2d": t2d}, str(path))
    return path


@pytest.mark.slow
def test_an_online_run_over_the_sglang_engine_killed_mid_way_resumes_where_it_stopped(
    targets, fake, tmp_path
):
    """Killed in step 4, after the step-3 checkpoint, then run again: the steps, evaluations and
    weights of a run that was never killed (one process: the loop is the same on every rank)."""
    fake("0.5.23")
    target = TargetParams(path=str(targets["llama"]), device="cpu", dtype="float32")
    params = ExtractParams(
        engine="sglang",
        layers=LAYERS,
        dtype="float32",
        shard_tokens=60,
        store="none",
        sglang=ExtractSGLangParams(tp_size=1, max_tokens_per_forward=64),
    )
    hidden = tmp_path / "hidden"
    extract(write_merged(tmp_path / "merged"), hidden, params, target)
    meta, vocab = read_meta(hidden), write_vocab(tmp_path / "vocab.safetensors")
    features = online_features(params, target, meta, torch.device("cpu"), meta.aux_hf_indices)
    train_set, eval_set = HiddenStates(hidden, "train"), HiddenStates(hidden, "eval")

    def objective() -> Objective:
        torch.manual_seed(0)
        target_config = AutoConfig.from_pretrained(target.path, local_files_only=True)
        drafter = train_stage.build_drafter(target_config, meta.aux_hf_indices, vocab, {})
        return Objective(drafter, *embedding_and_head(target.path), 3, 0.8)

    s, quiet = settings(6), {"log": lambda _: None, "features": features}
    cpu = torch.device("cpu")
    straight = objective()
    history = train(straight, train_set, eval_set, s, tmp_path / "a", cpu, **quiet)
    with pytest.raises(KeyboardInterrupt):
        killed = KilledAfter(train_set, 3, s.batch_size)
        train(objective(), killed, eval_set, s, tmp_path / "b", cpu, **quiet)
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state"]["step"] == 3
    resumed = objective()
    again = train(resumed, train_set, eval_set, s, tmp_path / "b", cpu, **quiet)
    assert again.steps == history.steps
    assert json.dumps(again.evals) == json.dumps(history.evals)
    for name, weight in straight.drafter.state_dict().items():
        assert torch.equal(resumed.drafter.state_dict()[name], weight), name


def write_params(
    path: Path, target: Path, engine: str, store: str, sglang: dict, release: str
) -> Path:
    params = {
        "target": {"path": str(target), "device": "cpu", "dtype": "float32"},
        "extract": {
            "engine": engine,
            "layers": LAYERS,
            "dtype": "float32",
            "shard_tokens": 60,
            "store": store,
            "sglang": sglang,
        },
        "train": {**TRAIN, "sglang_version": release},  # the export serves on it
    }
    path.write_text(yaml.safe_dump(params))
    return path


def run(cmd: list, cwd: Path, env: dict) -> str:
    proc = subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def extract_then_train(tmp: Path, name: str, params: Path, env: dict, kill: bool = False) -> dict:
    """extract (one process), then train under torchrun with 2 ranks; reports/train.json. With
    `kill`, the training is first killed (SIGKILL, every process) once its first checkpoint is
    in place, then run again to the end, which must say it resumed."""
    hidden, reports = tmp / f"hidden-{name}", tmp / f"reports-{name}"
    run(
        [sys.executable, "-m", "stages.extract", "--params", params, "--merged", tmp / "merged"]
        + ["--out", hidden, "--report", reports / "extract.json"],
        tmp,
        env,
    )
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--standalone"]
    checkpoints = tmp / f"checkpoints-{name}"
    train = (
        [*torchrun, "--nproc-per-node", "2", "-m", "stages.train", "--params", params]
        + ["--hidden-dir", hidden, "--vocab-file", tmp / "vocab.safetensors"]
        + ["--checkpoint-dir", checkpoints, "--out-dir", tmp / f"drafter-{name}"]
        + ["--report", reports / "train.json", "--plots", reports / "plots"]
    )
    if kill:
        killed_at = killed_after_first_checkpoint(train, checkpoints / "last.pt", tmp, env)
        assert not (reports / "train.json").exists(), "the run ended before it was killed"
        for record in tmp.glob("fake-*.jsonl"):  # the rerun's forwards alone, rank by rank
            record.unlink()
        rerun = run(train, tmp, env)
        assert f"[train] resumed at step {killed_at}" in rerun, rerun
    else:
        run(train, tmp, env)
    return json.loads((reports / "train.json").read_text())


def killed_after_first_checkpoint(cmd: list, last: Path, cwd: Path, env: dict) -> int:
    """Start torchrun's `cmd`, SIGKILL its workers and then it once `last` is in place; the step
    that checkpoint holds."""
    proc = subprocess.Popen(
        list(map(str, cmd)),
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in [*workers(proc.pid), proc.pid]:  # the workers run in sessions of their own
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert last.exists(), "no checkpoint was written before the run ended"
    return int(torch.load(last, weights_only=True)["state"]["step"])


def losses(tmp: Path, name: str) -> list[float]:
    with (tmp / f"reports-{name}" / "plots" / "train_loss.csv").open() as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("family", "release", "sglang"),
    [
        ("llama", "0.5.14", {"tp_size": 2, "max_tokens_per_forward": 64}),
        ("deepseek", "0.5.23", {"tp_size": 2, "ep_size": 2, "max_tokens_per_forward": 64}),
    ],
)
def test_online_training_over_a_tensor_parallel_target_follows_offline_training(
    family, release, sglang, targets, tmp_path
):
    """Each step gathers both ranks' batches into one forward of the 2-rank target. Killed
    (kill -9, both ranks) after its first checkpoint and run again, it resumes there and ends
    with offline training's loss curve over 2 ranks (features extracted by the hf engine and
    stored), to 1e-5 relative; train.json says the target ran online and what share of the step
    it took."""
    write_merged(tmp_path / "merged")
    write_vocab(tmp_path / "vocab.safetensors")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for name in NCCL_ENV:
        env.pop(name, None)
    target = targets[family]
    offline = write_params(tmp_path / "offline.yaml", target, "hf", "all", {}, release)
    stored = extract_then_train(tmp_path, "offline", offline, env)

    where = fake_sglang.write_distribution(tmp_path / "dist", release)
    record = tmp_path / "fake-{rank}.jsonl"
    env.update(PYTHONPATH=fake_sglang.pythonpath(release, where), FAKE_SGLANG_RECORD=str(record))
    online = write_params(tmp_path / "online.yaml", target, "sglang", "none", sglang, release)
    report = extract_then_train(tmp_path, "online", online, env, kill=True)

    assert stored["features"] == "stored" and stored["target_forward_share"] is None
    assert report["features"] == "online sglang" and report["world_size"] == 2
    assert 0 < report["target_forward_share"] < 1
    assert losses(tmp_path, "online") == pytest.approx(losses(tmp_path, "offline"), rel=1e-5)
    assert report["best_replayed_tau"] == pytest.approx(stored["best_replayed_tau"], rel=1e-5)
    forwards = []
    for rank in (0, 1):
        lines = Path(str(record).format(rank=rank)).read_text().splitlines()
        events = [json.loads(line) for line in lines]
        forwards.append([e for e in events if e.get("event") == "forward"])
    lengths = [[f["lengths"] for f in rank] for rank in forwards]
    assert lengths[0] and lengths[0] == lengths[1]  # every forward on both ranks, the same samples
