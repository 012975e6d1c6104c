"""Extraction (hooks equal HF hidden states, shard resume) and the training loop (exact resume,
best checkpoint by replayed acceptance, evaluation over every span), on the real stories260K
target."""

import dataclasses
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig

from stages.artifacts.hidden import HiddenStates
from stages.drafter.checkpoints import start_or_resume
from stages.drafter.model import Eagle3Config, Eagle3Drafter
from stages.drafter.training import (
    LoopSettings,
    Objective,
    TrainingSettings,
    autocast_for,
    batch_order,
    evaluate,
    refuse_diverged,
    train,
)
from stages.drafter.vocab import build_draft_vocab
from stages.extract import extract
from stages.params.dflash import DFlashParams
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.params.train import TrainParams
from stages.runtime.files import atomic_path, remove_path
from stages.target_model.model import load_causal_lm
from stages.target_model.weights import embedding_and_head
from stages.wiring.drafter_run import loop_settings
from tests.conftest import STORIES, STORIES_REL

pytestmark = pytest.mark.shared(STORIES_REL)

TARGET = TargetParams(path=str(STORIES))
LAYERS = [1, 2, 3]


def merged(tmp_path, n_train=10, n_eval=3):
    g = torch.Generator().manual_seed(0)
    out = tmp_path / "merged"
    out.mkdir()
    for split, n in (("train", n_train), ("eval", n_eval)):
        rows = []
        for i in range(n):
            length = 20 + 3 * i
            ids = [1] + torch.randint(3, 512, (length - 1,), generator=g).tolist()
            spans = [[6, 12], [15, length]]  # two turns, the template's ids between them
            rows.append(
                dict(
                    sample_id=f"{split}/{i}",
                    dataset="d",
                    input_ids=ids,
                    loss_spans=spans,
                    length=length,
                    truncated=False,
                    split=split,
                )
            )
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    return out


@pytest.fixture(scope="module")
def hidden(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("x")
    m = merged(tmp)
    params = ExtractParams(layers=LAYERS, shard_tokens=120, batch_tokens=200, dtype="float32")
    extract(m, tmp / "hidden", params, TARGET)
    return m, tmp / "hidden", params


def test_features_equal_hf_hidden_states(hidden):
    m, h, _ = hidden
    model = load_causal_lm(str(STORIES))
    index = pq.read_table(h / "index.parquet").to_pylist()
    assert len({r["shard"] for r in index}) > 2
    data = HiddenStates(h, "eval")
    row = pq.read_table(m / "eval.parquet").to_pylist()[2]
    sample = data[2]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([row["input_ids"]]), output_hidden_states=True)
    expect_aux = torch.cat([ref.hidden_states[i][0] for i in LAYERS], dim=-1)
    torch.testing.assert_close(sample["aux"], expect_aux, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sample["last"], ref.hidden_states[-1][0], atol=1e-4, rtol=1e-4)
    assert sample["input_ids"].tolist() == row["input_ids"]
    assert sample["loss_mask"].tolist() == (
        [0] * 6 + [1] * 6 + [0] * 3 + [1] * (row["length"] - 15)
    )


def test_extract_resumes_shard_by_shard(hidden, tmp_path):
    m, h, params = hidden
    shards = sorted(h.glob("shard-*.safetensors"))
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    shards[1].unlink()
    extract(m, h, params, TARGET)
    assert shards[1].exists()
    assert all(p.stat().st_mtime_ns == stamps[p] for p in shards if p != shards[1])
    with safe_open(str(shards[1]), "pt") as f:
        assert f.get_tensor("aux").shape[-1] == 3 * 64


def objective(h):
    target_cfg = AutoConfig.from_pretrained(STORIES)
    counts = torch.bincount(
        torch.randint(0, 512, (4000,), generator=torch.Generator().manual_seed(1)), minlength=512
    )
    d2t, t2d, _ = build_draft_vocab(counts, 256)
    torch.manual_seed(0)
    drafter = Eagle3Drafter(Eagle3Config.from_target(target_cfg, 256, LAYERS))
    drafter.set_vocab(d2t, t2d)
    embed, head = embedding_and_head(STORIES)
    return Objective(drafter, embed, head, ttt_steps=3, decay=0.8)


def settings(total):
    return LoopSettings(
        ttt_steps=3,
        decay=0.8,
        total_steps=total,
        batch_size=4,
        lr=1e-2,
        min_lr_ratio=0.1,
        warmup_steps=2,
        weight_decay=0.0,
        grad_clip=0.5,
        eval_every=2,
        eval_num_steps=3,
        eval_max_samples=8,
        checkpoint_every=3,
        seed=0,
        length_window=2,  # batches of like lengths (batch_order)
    )


class KilledAfter:
    """A train set whose process dies when step `steps + 1` fetches its first sample."""

    def __init__(self, data, steps, batch_size):
        self.data, self.left = data, steps * batch_size
        self.lengths = data.lengths

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        if self.left == 0:
            raise KeyboardInterrupt("killed")
        self.left -= 1
        return self.data[i]


@pytest.mark.slow
def test_training_resumes_exactly(hidden, tmp_path):
    _, h, _ = hidden
    train_set, eval_set = HiddenStates(h, "train"), HiddenStates(h, "eval")
    cpu = torch.device("cpu")
    straight, logs = objective(h), []
    history = train(
        straight, train_set, eval_set, settings(6), tmp_path / "a", cpu, log=logs.append
    )
    assert [e["step"] for e in history.evals] == [2, 4, 6]
    # the first step is named with its time before any other step's line (it may compile)
    firsts = [i for i, line in enumerate(logs) if line.startswith("[train] first step ")]
    assert firsts and firsts[0] < next(i for i, line in enumerate(logs) if "step 6/6" in line)
    assert len(firsts) == 1 and float(logs[firsts[0]].split()[3]) > 0, logs
    # padding: what the steps' batches, in batch_order's order, pad to their longest
    lengths, order = train_set.lengths, []
    for epoch in range(3):  # 6 steps of 4 over 10 samples (the short batch of 2 ends each epoch)
        order += [batch_order(lengths, 0, epoch, 4, 2)[i : i + 4] for i in (0, 4, 8)]
    batches = [[lengths[i] for i in b] for b in order[:6]]
    positions = sum(len(b) * max(b) for b in batches)
    padding = positions - sum(map(sum, batches))
    assert padding > 0 and history.padding_share == pytest.approx(padding / positions)
    with pytest.raises(KeyboardInterrupt):  # killed in step 4, after the step-3 checkpoint
        train(
            objective(h),
            KilledAfter(train_set, 3, 4),
            eval_set,
            settings(6),
            tmp_path / "b",
            cpu,
            log=lambda _: None,
        )
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state"]["step"] == 3
    resumed = objective(h)
    again = train(
        resumed, train_set, eval_set, settings(6), tmp_path / "b", cpu, log=lambda _: None
    )
    assert again.padding_share == history.padding_share  # counted over the whole run
    for (name, a), (_, b) in zip(
        straight.drafter.state_dict().items(), resumed.drafter.state_dict().items()
    ):
        torch.testing.assert_close(a, b, msg=name)
    best = torch.load(tmp_path / "a" / "best.pt", weights_only=True)
    assert best["tau"] == pytest.approx(max(e["replayed_tau"] for e in history.evals), abs=1e-4)
    assert all(1 <= e["replayed_tau"] <= 4 for e in history.evals)  # chain of 3 drafts


@pytest.mark.slow
def test_a_failed_compile_goes_on_eager_with_the_same_steps(hidden, tmp_path, monkeypatch):
    """A compilation that fails mid-run (here the recompile for the second batch shape) does not
    end the run: it goes on eager from that step, with the losses an eager run has, and says at
    which step in its log and its report."""
    from stages.drafter import training

    _, h, _ = hidden
    train_set, eval_set = HiddenStates(h, "train"), HiddenStates(h, "eval")
    cpu, quiet = torch.device("cpu"), lambda _: None
    eager = train(objective(h), train_set, eval_set, settings(4), tmp_path / "e", cpu, log=quiet)
    assert eager.compile_failed_at is None
    graphs = []

    def backend(gm, _inputs):
        graphs.append(gm)
        if len(graphs) > 1:
            raise RuntimeError("no kernel for this shape")
        return gm

    torch._dynamo.reset()
    monkeypatch.setattr(training, "compiles", lambda compile, device: compile)
    monkeypatch.setattr(training, "compiled_objective", lambda m: torch.compile(m, backend=backend))
    logs: list[str] = []
    compiled = dataclasses.replace(settings(4), compile=True)
    history = train(
        objective(h), train_set, eval_set, compiled, tmp_path / "compiled", cpu, log=logs.append
    )
    assert len(graphs) == 2 and history.compile_failed_at in (2, 3, 4), history.compile_failed_at
    failed = [line for line in logs if "compiling the objective failed" in line]
    assert len(failed) == 1 and "no kernel for this shape" in failed[0], logs
    assert failed[0].startswith(f"[train] step {history.compile_failed_at}:")
    assert [r["loss"] for r in history.steps] == pytest.approx(
        [r["loss"] for r in eager.steps], rel=1e-5
    )


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_step(hidden, tmp_path):
    """A diverged step (an FP8 run of stories260K's did, on a GPU) stops the run there, rather
    than training NaN weights to the end and exporting them; the checkpoint before it is kept."""
    _, h, _ = hidden
    train_set, eval_set = HiddenStates(h, "train"), HiddenStates(h, "eval")
    diverging, steps = objective(h), []
    forward = diverging.forward

    def nan_at_step_4(batch):
        loss, metrics = forward(batch)
        if torch.is_grad_enabled():  # evaluations run without
            steps.append(1)
        return (loss * float("nan") if len(steps) == 4 else loss), metrics

    diverging.forward = nan_at_step_4
    stopped = r"^the loss is nan at step 4: training diverged\. Lower train\.lr \(.+\) or lengthen "
    with pytest.raises(ValueError, match=stopped + r"train\.warmup_ratio, then rerun"):
        train(diverging, train_set, eval_set, settings(6), tmp_path, torch.device("cpu"))
    assert len(steps) == 4
    assert torch.load(tmp_path / "last.pt", weights_only=True)["state"]["step"] == 3


def test_a_diverged_run_names_the_keys_of_its_own_section():
    """The loop's settings carry their params section (`loop_settings`, from the section's key),
    so the refusal of a DFlash run names dflash's keys, not train's."""
    s = loop_settings(DFlashParams(fp8=True), train_samples=10, kind=TrainingSettings)
    assert s.section == "dflash"
    refuse_diverged(1.5, 7, s)  # a finite loss goes on
    with pytest.raises(ValueError) as stopped:
        refuse_diverged(float("inf"), 7, s)
    assert str(stopped.value) == (
        f"the loss is inf at step 7: training diverged. Lower dflash.lr ({s.lr:g}) or lengthen "
        "dflash.warmup_ratio or set dflash.fp8 false, then rerun (checkpoints before step 7 are "
        "kept)"
    )


def test_evaluation_replays_every_turn_and_adds_up_over_batches(hidden):
    _, h, _ = hidden
    eval_set, cpu = HiddenStates(h, "eval"), torch.device("cpu")
    scored = objective(h)
    together, alone = (
        evaluate(
            scored, eval_set, dataclasses.replace(settings(2), batch_size=b), cpu, autocast_for(cpu)
        )
        for b in (4, 1)
    )
    # Per sample (lengths 20, 23, 26): turn [6, 12) gives tokens 7-11 by rounds (6 comes from the
    # prefill), turn [15, length) tokens 16 to the end.
    assert together.replay_tokens.tolist() == [5 * 3 + 4 + 7 + 10] * 3
    assert torch.equal(together.replay_rounds, alone.replay_rounds)


def test_compile_auto_compiles_the_steps_on_a_gpu_and_not_on_the_cpu():
    """train.compile's default, auto, compiles on a GPU and runs eager on the CPU (where
    compiling does not pay); false runs eager on both."""
    from stages import train as train_stage
    from stages.drafter.training import compiles
    from tests.conftest import ROOT

    default = TrainParams.read(ROOT / "params.yaml")
    assert default.compile == "auto" == TrainParams.__dataclass_fields__["compile"].default
    off = dataclasses.replace(default, compile=False)
    on = {
        (value, device): compiles(train_stage.settings(p, 10).compile, torch.device(device))
        for value, p in (("auto", default), ("false", off))
        for device in ("cuda", "cpu")
    }
    assert on == {
        ("auto", "cuda"): True,
        ("auto", "cpu"): False,
        ("false", "cuda"): False,
        ("false", "cpu"): False,
    }


@pytest.mark.slow
def test_a_checkpoint_of_format_3_resumes_exactly(hidden, tmp_path):
    """Checkpoint format 3 (written before the loop served both families, up to 926f0e3): the
    best acceptance as `best_replayed_tau`, no objective state, run.json's format 3. A run
    killed with such a checkpoint resumes it (checked against that commit's own code on the demo,
    docs/performance.md) and ends as the uninterrupted run."""
    _, h, _ = hidden
    train_set, eval_set = HiddenStates(h, "train"), HiddenStates(h, "eval")
    cpu, quiet = torch.device("cpu"), {"log": lambda _: None}
    straight = objective(h)
    train(straight, train_set, eval_set, settings(6), tmp_path / "a", cpu, **quiet)
    folder = tmp_path / "b"
    folder.mkdir()
    start_or_resume(folder, RUN)
    with pytest.raises(KeyboardInterrupt):  # killed in step 4, after the step-3 checkpoint
        train(objective(h), KilledAfter(train_set, 3, 4), eval_set, settings(6), folder, cpu)
    as_format_3(folder)
    start_or_resume(folder, RUN)
    assert (folder / "last.pt").exists()  # kept: the same run
    resumed = objective(h)
    train(resumed, train_set, eval_set, settings(6), folder, cpu, **quiet)
    for (name, a), (_, b) in zip(
        straight.drafter.state_dict().items(), resumed.drafter.state_dict().items()
    ):
        torch.testing.assert_close(a, b, msg=name)


RUN = {"train": {"lr": 0.01}, "hidden": "features", "vocab": "ids"}


def as_format_3(folder):
    """last.pt and run.json as format 3 held them (926f0e3's training.py `checkpoint` and
    `start_or_resume`): the state's best under its old name, no `objective` entry."""
    ckpt = torch.load(folder / "last.pt", weights_only=True)
    ckpt["state"]["best_replayed_tau"] = ckpt["state"].pop("best_tau")
    del ckpt["objective"]
    remove_path(folder / "last.pt")
    with atomic_path(folder / "last.pt", 0, checksum=True) as tmp:
        torch.save(ckpt, tmp)
    run = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**run, "checkpoint_format": 3}))
