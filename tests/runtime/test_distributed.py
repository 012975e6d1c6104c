"""extract and train under torchrun (2 CPU processes, gloo) against their 1-process runs, on the
real stories260K target: the same shards bit for bit, the same loss curve, one writer for every
shared file, a 2-process checkpoint resumed by 1 process, and the NCCL settings in place."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

from stages.drafter.vocab import build_draft_vocab
from stages.runtime.files import CHECKSUM_SUFFIX
from stages.runtime.parallel import NCCL_ENV
from tests.conftest import ROOT, STORIES, STORIES_REL

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.shared(STORIES_REL),
]
RECORDER = Path(__file__).parents[1] / "dist_fixtures" / "record_writes.py"
WORLD = 2
VOCAB = 512  # stories260K's vocabulary, all of it in the draft vocabulary


def write_merged(out: Path, n_train: int = 8, n_eval: int = 3) -> Path:
    """Samples of different lengths and different numbers of supervised positions (one to three
    turns, as regenerate: all_turns gives).

    Each rank's share of a global batch then holds a different share of its supervised positions:
    the loss and gradient match one process only if every rank divides by the global count.
    """
    g = torch.Generator().manual_seed(0)
    out.mkdir(parents=True)
    for split, n in (("train", n_train), ("eval", n_eval)):
        rows = []
        for i in range(n):
            length = 20 + 5 * i
            ids = [1] + torch.randint(3, VOCAB, (length - 1,), generator=g).tolist()
            starts = range(6 + (i % 3), length, 12)[: 1 + i % 3]
            rows.append(
                dict(
                    sample_id=f"{split}/{i}",
                    dataset="d",
                    input_ids=ids,
                    loss_spans=[[s, min(s + 8, length)] for s in starts],
                    length=length,
                    truncated=False,
                    split=split,
                )
            )
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    return out


def write_params(path: Path) -> Path:
    params = {
        "target": {"path": str(STORIES), "device": "cpu"},
        "extract": {
            "layers": [1, 2, 3],
            "shard_tokens": 120,
            "batch_tokens": 200,
            "dtype": "float32",
        },
        "train": {
            "ttt_steps": 3,
            "max_steps": 6,
            "batch_size": 4,
            "lr": 1e-2,
            "min_lr_ratio": 0.1,
            "warmup_ratio": 0.3,
            "eval_every": 2,
            "eval_max_samples": 8,
            "checkpoint_every": 3,
            "device": "cpu",
        },
    }
    path.write_text(yaml.safe_dump(params))
    return path


def write_vocab(path: Path) -> Path:
    d2t, t2d, _ = build_draft_vocab(torch.ones(VOCAB, dtype=torch.int64), VOCAB)
    path.parent.mkdir(parents=True)
    save_file({"d2t": d2t, "t2d": t2d}, str(path))
    return path


def stage_env() -> dict[str, str]:
    """A stage subprocess's environment: one thread, the project importable, and none of the
    NCCL settings (the stages set those themselves)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for name in NCCL_ENV:
        env.pop(name, None)
    return env


def torchrun(world: int, script: Path) -> list[str]:
    """The command running `script` as `world` processes of one host under torchrun."""
    return [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        str(world),
        str(script),
    ]


def stage(module: str, args: list, tmp: Path, world: int = 1) -> tuple[str, Path | None]:
    """(output, record dir) of `python -m module args`, or of torchrun with `world` processes."""
    env = stage_env()
    if world == 1:
        cmd, record = [sys.executable, "-m", module], None
    else:
        record = tmp / f"record-{module}-{world}"
        record.mkdir()
        env.update(RECORD_DIR=str(record), RECORD_ROOT=str(tmp))
        cmd = [*torchrun(world, RECORDER), module]
    proc = subprocess.run([*cmd, *map(str, args)], cwd=tmp, env=env, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output, record


def writes(record: Path, rank: int) -> list[Path]:
    """Files rank `rank` put in place, in order (empty if it wrote none)."""
    log = record / f"writes-{rank}.tsv"
    return (
        [Path(line.split("\t")[1]) for line in log.read_text().splitlines()] if log.exists() else []
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """extract and train, each by 1 process and by torchrun; the output and record of each."""
    tmp = tmp_path_factory.mktemp("dist")
    merged = write_merged(tmp / "merged")
    params = write_params(tmp / "params.yaml")
    write_vocab(tmp / "vocab" / "d2t_t2d.safetensors")
    out = {"tmp": tmp}
    for world in (1, WORLD):
        out[f"extract-{world}"] = stage(
            "stages.extract",
            [
                "--params",
                params,
                "--merged",
                merged,
                "--out",
                tmp / f"hidden-{world}",
                "--report",
                tmp / f"reports-{world}" / "extract.json",
            ],
            tmp,
            world,
        )
    for world in (1, WORLD):
        out[f"train-{world}"] = stage("stages.train", train_args(tmp, str(world)), tmp, world)
    return out


def train_args(tmp: Path, run: str) -> list:
    """Arguments of a train run on the 1-process features, its outputs named by `run`."""
    return [
        "--params",
        tmp / "params.yaml",
        "--hidden-dir",
        tmp / "hidden-1",
        "--vocab-file",
        tmp / "vocab" / "d2t_t2d.safetensors",
        "--checkpoint-dir",
        tmp / f"checkpoints-{run}",
        "--out-dir",
        tmp / f"drafter-{run}",
        "--report",
        tmp / f"reports-{run}" / "train.json",
        "--plots",
        tmp / f"reports-{run}" / "plots",
        "--live",
        tmp / f"live-{run}",
    ]


def live_curve(live: Path, name: str) -> list[tuple[int, float]]:
    """(step, value) of one figure as DVCLive logged it (plots/metrics/<name>.tsv)."""
    with (live / "plots" / "metrics" / f"{name}.tsv").open() as f:
        return [
            (int(r["step"]), float(r[name.split("/")[-1]]))
            for r in csv.DictReader(f, delimiter="\t")
        ]


def test_the_live_log_is_the_reports_curves_as_they_are_trained(runs):
    """DVCLive's figures (what `dvc exp show` and DVC Studio show of a running experiment) are
    the train report's own: each logged step's loss, each evaluation's replayed tau; under
    torchrun rank 0 alone writes them, and they are the one-process run's."""
    tmp = runs["tmp"]
    with (tmp / "reports-1" / "plots" / "train_loss.csv").open() as f:
        losses = {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}
    with (tmp / "reports-1" / "plots" / "train_evals.csv").open() as f:
        taus = [(int(r["step"]), float(r["replayed_tau"])) for r in csv.DictReader(f)]
    logged = live_curve(tmp / "live-1", "train/loss")
    assert logged and all(losses[step] == loss for step, loss in logged)
    assert logged[-1][0] == max(losses)  # the last step is always logged
    assert live_curve(tmp / "live-1", "eval/replayed_tau") == taus
    summary = json.loads((tmp / "live-1" / "metrics.json").read_text())
    assert summary["eval"]["replayed_tau"] == taus[-1][1]
    assert live_curve(tmp / f"live-{WORLD}", "train/loss") == logged


def tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_extract_under_torchrun_equals_one_process(runs):
    tmp = runs["tmp"]
    one, many = tmp / "hidden-1", tmp / f"hidden-{WORLD}"
    shards = sorted(p.name for p in one.glob("shard-*.safetensors"))
    assert len(shards) >= 2 * WORLD
    assert sorted(p.name for p in many.glob("shard-*.safetensors")) == shards
    for name in shards:
        a, b = tensors(one / name), tensors(many / name)
        assert a.keys() == b.keys() and a["aux"].dtype == torch.float32
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}:{key}"
    assert pq.read_table(one / "index.parquet").equals(pq.read_table(many / "index.parquet"))
    assert json.loads((one / "meta.json").read_text()) == json.loads(
        (many / "meta.json").read_text()
    )
    _, record = runs[f"extract-{WORLD}"]
    for rank in range(WORLD):
        written = [p.name for p in writes(record, rank) if p.parent == many]
        mine = [s for k, s in enumerate(shards) if k % WORLD == rank]
        checked = mine + (["index.parquet"] if rank == 0 else [])
        assert sorted(written) == sorted(
            checked
            + [name + CHECKSUM_SUFFIX for name in checked]  # each file's size and sha256
            + (["meta.json"] if rank == 0 else [])
        )


def plot(report_dir: Path, name: str) -> list[dict]:
    with open(report_dir / "plots" / f"{name}.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def assert_same_curves(a: Path, b: Path) -> None:
    """The loss and acceptance plots of two runs agree to float summation order.

    Every rank divides its sums by its share of the global batch's valid count, so DDP's average
    of per-rank losses and gradients is, in exact arithmetic, the 1-process mean over the global
    batch; measured, the curves agree to every printed decimal. 1e-4 relative lies between that
    and what a wrong split shows: logging rank 0's own loss is 5.5e-4 off at step 1, and per-rank
    means over this unequal supervision differ from the global mean by up to 6.7e-3.
    """
    for name in ("train_loss", "train_acceptance"):
        x, y = plot(a, name), plot(b, name)
        assert len(x) == len(y) > 0, name
        for row_x, row_y in zip(x, y):
            assert row_x == pytest.approx(row_y, rel=1e-4), (name, row_x, row_y)


def test_train_under_torchrun_matches_one_process(runs):
    tmp = runs["tmp"]
    losses = plot(tmp / "reports-1", "train_loss")
    assert len(losses) == 6 and losses[-1]["loss"] < losses[0]["loss"] - 1  # it learns
    assert_same_curves(tmp / "reports-1", tmp / f"reports-{WORLD}")
    one, many = (
        json.loads((tmp / f"reports-{run}" / "train.json").read_text()) for run in (1, WORLD)
    )
    assert (one.pop("world_size"), many.pop("world_size")) == (1, WORLD)
    assert one.pop("tokens_per_s") > 0 and many.pop("tokens_per_s") > 0
    assert one.pop("warmup_s") >= 0 and many.pop("warmup_s") >= 0
    # each rank pads its share of a batch to that share's longest sample: never more padding
    assert 0 <= many.pop("padding_share") <= one.pop("padding_share")
    assert one.pop("compile_failed_at_step") is many.pop("compile_failed_at_step") is None
    assert one.pop("features") == many.pop("features") == "stored"
    assert one.pop("target_forward_share") is many.pop("target_forward_share") is None
    assert many == pytest.approx(one, rel=1e-4)
    output, record = runs[f"train-{WORLD}"]
    assert output.count("[train] eval step 2") == 1  # one rank reports
    assert writes(record, 1) == []  # checkpoints, reports and the export: rank 0 only
    checkpoints = tmp / f"checkpoints-{WORLD}"
    names = [p.name for p in writes(record, 0) if p.parent == checkpoints]
    assert names.count("last.pt") == 2 and names.count("run.json") == 1  # steps 3 and 6
    assert (tmp / f"drafter-{WORLD}" / "model.safetensors").exists()


def test_two_process_checkpoint_resumes_in_one_process(runs):
    """The 2-process checkpoint directory as it stood after step 3, resumed by 1 process."""
    tmp = runs["tmp"]
    _, record = runs[f"train-{WORLD}"]
    source, resumed = tmp / f"checkpoints-{WORLD}", tmp / "checkpoints-resumed"
    for n, path in enumerate(writes(record, 0), start=1):
        if path.parent == source:
            resumed.mkdir(exist_ok=True)
            shutil.copyfile(record / f"0-{n}-{path.name}", resumed / path.name)
            if path.name == "last.pt" + CHECKSUM_SUFFIX:  # put in place after the checkpoint
                break
    assert torch.load(resumed / "last.pt", weights_only=True)["state"]["step"] == 3
    output, _ = stage("stages.train", train_args(tmp, "resumed"), tmp)
    assert "resumed at step 3" in output
    assert_same_curves(tmp / "reports-1", tmp / "reports-resumed")


def test_torchrun_ranks_get_the_nccl_settings(runs):
    """Set by the stages themselves (stage() removes them from the launch environment)."""
    for kind in ("extract", "train"):
        _, record = runs[f"{kind}-{WORLD}"]
        for rank in range(WORLD):
            env = json.loads((record / f"env-{rank}.json").read_text())
            assert {k: env.get(k) for k in NCCL_ENV} == NCCL_ENV, (kind, rank)
