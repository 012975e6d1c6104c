"""extract.store on the committed demo target (CPU, float32 features): `supervised` stores only
what the loss reads and trains exactly as `all`; `none` stores token ids and the train stage runs
the target on each batch (online), on the offline loss curve, and resumes."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig

from stages import extract as extract_stage
from stages import train as train_stage
from stages.artifacts.hidden import HiddenStates, collate, label_positions, read_meta, shard_files
from stages.drafter.training import Objective, train
from stages.extract import extract
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.target_model.weights import embedding_and_head
from stages.wiring.online_features import online_features
from tests.conftest import DEMO_TARGET
from tests.perf.bench_kimi_width import run_train
from tests.reliability import demo_params, write_vocab
from tests.runtime.test_distributed import write_merged
from tests.stages.test_extract_train import KilledAfter, settings

CPU = torch.device("cpu")
TARGET = TargetParams(path=str(DEMO_TARGET), device="cpu", dtype="float32", cpu_threads=1)
EXTRACT = {"layers": [2, 4, 5], "shard_tokens": 120, "batch_tokens": 256, "dtype": "float32"}
HIDDEN = 128  # the demo target's
MAX_LENGTH = 24  # cuts the longer samples inside a supervised span


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """The same merged samples (spans ending before the sample's end) extracted in each store."""
    tmp = tmp_path_factory.mktemp("stores")
    merged = write_merged(tmp / "merged")
    write_vocab(tmp / "vocab.safetensors")
    for store in ("all", "supervised", "none"):
        params = ExtractParams(**EXTRACT, store=store)
        report = extract(merged, tmp / store, params, TARGET)
        report.write(tmp / f"{store}.json")
    return {store: tmp / store for store in ("all", "supervised", "none")}


def merged_rows(hidden: Path) -> dict[str, dict]:
    folder = hidden.parent / "merged"
    return {
        r["sample_id"]: r
        for split in ("train", "eval")
        for r in pq.read_table(folder / f"{split}.parquet").to_pylist()
    }


def test_supervised_shards_keep_rows_to_the_last_supervised_token_and_labels_only(stores):
    rows = merged_rows(stores["all"])
    index = pq.read_table(stores["supervised"] / "index.parquet").to_pylist()
    labels_per_shard: dict[int, int] = {}
    stored = labels = 0
    for r in index:
        spans = rows[r["sample_id"]]["loss_spans"]
        assert r["length"] == max(end for _, end in spans)  # the rows after it are gone
        assert r["last_offset"] == labels_per_shard.get(r["shard"], 0)
        supervised = {p for start, end in spans for p in range(max(start, 1), end)}
        labels_per_shard[r["shard"]] = r["last_offset"] + len(supervised)
        stored, labels = stored + r["length"], labels + len(supervised)
    for k, count in labels_per_shard.items():
        with safe_open(str(stores["supervised"] / f"shard-{k:05d}.safetensors"), "pt") as f:
            assert f.get_slice("last").get_shape() == [count, HIDDEN]

    tokens = sum(r["length"] for r in rows.values())
    want = round((stored * 3 * HIDDEN + labels * HIDDEN) * 4 / tokens)
    meta = json.loads((stores["supervised"] / "meta.json").read_text())
    report = json.loads((stores["supervised"].parent / "supervised.json").read_text())
    assert meta["store"] == report["store"] == "supervised"
    assert meta["bytes_per_token"] == report["bytes_per_token"] == want
    assert meta["bytes_per_token_all"] == report["bytes_per_token_all"] == 4 * HIDDEN * 4
    assert want < 0.7 * 4 * HIDDEN * 4  # this data's spans: about 61% of all's bytes
    assert report["bytes"] == stored * 3 * HIDDEN * 4 + labels * HIDDEN * 4
    everything = json.loads((stores["all"].parent / "all.json").read_text())
    assert everything["bytes_per_token"] == everything["bytes_per_token_all"] == 2048
    assert "store" not in json.loads((stores["all"] / "meta.json").read_text())  # as it was
    nothing = json.loads((stores["none"].parent / "none.json").read_text())
    assert (nothing["bytes"], nothing["bytes_per_token"]) == (0, 0)


def test_supervised_samples_read_back_as_all_at_every_row_the_loss_reads(stores):
    full, kept = HiddenStates(stores["all"], "train"), HiddenStates(stores["supervised"], "train")
    for i in range(len(full)):
        a, s = full[i], kept[i]
        n = len(s["input_ids"])
        assert torch.equal(s["input_ids"], a["input_ids"][:n])
        assert torch.equal(s["loss_mask"], a["loss_mask"][:n])
        assert a["loss_mask"][:n][-1] == 1 and not a["loss_mask"][n:].any()
        torch.testing.assert_close(s["aux"], a["aux"][:n], rtol=1e-5, atol=1e-5)
        at = label_positions(s["loss_mask"])
        torch.testing.assert_close(s["last"][at], a["last"][:n][at], rtol=1e-5, atol=1e-5)
        assert not s["last"][~at].any()
    online = HiddenStates(stores["none"], "train")[0]
    assert set(online) == {"input_ids", "loss_mask"}
    assert torch.equal(online["input_ids"], kept[0]["input_ids"])


def objective(hidden: Path, ttt_steps: int = 3) -> Objective:
    meta = read_meta(hidden)
    target_config = AutoConfig.from_pretrained(DEMO_TARGET, local_files_only=True)
    torch.manual_seed(0)
    vocab = hidden.parent / "vocab.safetensors"
    drafter = train_stage.build_drafter(target_config, meta.aux_hf_indices, vocab, {})
    embed, head = embedding_and_head(DEMO_TARGET)
    return Objective(drafter, embed, head, ttt_steps, 0.8).place(CPU)


def loss_and_grads(model: Objective, batch: dict) -> tuple[torch.Tensor, object, dict]:
    model.zero_grad()
    loss, metrics = model(batch)
    loss.backward()
    return loss.detach(), metrics, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_rows_supervised_storage_drops_are_read_by_no_loss_term_or_metric(stores):
    """Noise in `last` off the label positions and in `aux` after each sample's last supervised
    token: bitwise the same loss, metrics and gradients."""
    data = HiddenStates(stores["all"], "train", MAX_LENGTH)
    batch = collate([data[i] for i in range(4)])
    noisy = dict(batch)
    g = torch.Generator().manual_seed(0)
    unread_last = ~torch.stack([label_positions(m) for m in batch["loss_mask"]])
    after_last = batch["loss_mask"].flip(1).cummax(1).values.flip(1) == 0
    noisy["last"] = torch.where(
        unread_last[..., None], torch.randn(batch["last"].shape, generator=g), batch["last"]
    )
    noisy["aux"] = torch.where(
        after_last[..., None], torch.randn(batch["aux"].shape, generator=g), batch["aux"]
    )
    assert unread_last.sum() > 40 and after_last.sum() > 10  # the test touches many rows
    model = objective(stores["all"])
    loss, metrics, grads = loss_and_grads(model, batch)
    noisy_loss, noisy_metrics, noisy_grads = loss_and_grads(model, noisy)
    assert torch.equal(loss, noisy_loss)
    assert all(torch.equal(getattr(metrics, f), getattr(noisy_metrics, f)) for f in vars(metrics))
    assert all(torch.equal(grads[n], noisy_grads[n]) for n in grads)


def test_training_on_supervised_storage_gives_the_loss_and_gradients_of_all(stores):
    """Batch by batch (samples cut at MAX_LENGTH): the same loss and gradients up to float32
    summation order (the batches are narrower), the same counts exactly."""
    model = objective(stores["all"])
    full = HiddenStates(stores["all"], "train", MAX_LENGTH)
    kept = HiddenStates(stores["supervised"], "train", MAX_LENGTH)
    for start in range(0, len(full), 4):
        picked = range(start, min(start + 4, len(full)))
        a = loss_and_grads(model, collate([full[i] for i in picked]))
        s = loss_and_grads(model, collate([kept[i] for i in picked]))
        torch.testing.assert_close(s[0], a[0], rtol=1e-5, atol=1e-6)
        for f in vars(a[1]):
            want = getattr(a[1], f)
            if f == "ce_sum":
                torch.testing.assert_close(getattr(s[1], f), want, rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(getattr(s[1], f), want), f
        for name, grad in a[2].items():
            torch.testing.assert_close(s[2][name], grad, rtol=1e-4, atol=1e-7, msg=name)


def loss_curve(plots: Path) -> list[float]:
    with (plots / "train_loss.csv").open() as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


@pytest.mark.slow
def test_online_training_follows_the_offline_loss_curve(stores, tmp_path):
    """The train stage on shards of token ids alone runs the target itself: the loss curve of
    training on stored features, to 1e-5 relative (float32 features; the target's forward sees
    other padded batches than extraction's, so its last bits may differ; measured: 1e-6)."""
    # the same batches: `none` stores each sample up to its last supervised token, so batches
    # grouped by length would be cut otherwise than from `all`'s whole samples
    train = {"max_steps": 6, "ttt_steps": 3, "max_length": 40, "length_window": 1}
    params = demo_params(tmp_path, train=train)
    vocab = stores["all"].parent / "vocab.safetensors"
    offline = run_train(tmp_path / "offline", params, vocab, stores["all"])
    online = run_train(tmp_path / "online", params, vocab, stores["none"])
    args = json.loads((tmp_path / "online" / "drafter" / "training_args.json").read_text())
    assert args["hidden_meta"]["store"] == "none"
    assert online["tokens_per_s"] > 0 and offline["tokens_per_s"] > 0
    curve = loss_curve(tmp_path / "online" / "plots")
    assert len(curve) == 6
    assert curve == pytest.approx(loss_curve(tmp_path / "offline" / "plots"), rel=1e-5)
    assert online["best_replayed_tau"] == pytest.approx(offline["best_replayed_tau"], rel=1e-5)


@pytest.mark.slow
def test_an_online_run_killed_mid_way_resumes_where_it_stopped(stores, tmp_path):
    hidden = stores["none"]
    meta = read_meta(hidden)
    features = online_features(ExtractParams(**EXTRACT), TARGET, meta, CPU, meta.aux_hf_indices)
    train_set, eval_set = HiddenStates(hidden, "train"), HiddenStates(hidden, "eval")
    quiet = {"log": lambda _: None, "features": features}
    s = dataclasses.replace(settings(6), batch_size=2, eval_max_samples=3)
    straight = objective(hidden)
    history = train(straight, train_set, eval_set, s, tmp_path / "a", CPU, **quiet)
    with pytest.raises(KeyboardInterrupt):  # killed in step 4, after the step-3 checkpoint
        killed = KilledAfter(train_set, 3, 2)
        train(objective(hidden), killed, eval_set, s, tmp_path / "b", CPU, **quiet)
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=True)["state"]["step"] == 3
    resumed = objective(hidden)
    again = train(resumed, train_set, eval_set, s, tmp_path / "b", CPU, **quiet)
    assert again.steps == history.steps
    assert json.dumps(again.evals) == json.dumps(history.evals)  # NaN where no chain got that far
    for name, weight in straight.drafter.state_dict().items():
        assert torch.equal(resumed.drafter.state_dict()[name], weight), name


def test_changing_the_store_extracts_again(stores, tmp_path, capsys):
    hidden = tmp_path / "hidden"
    merged = stores["all"].parent / "merged"
    extract(merged, hidden, ExtractParams(**EXTRACT), TARGET)
    before = json.loads((hidden / "meta.json").read_text())["fingerprint"]
    capsys.readouterr()
    extract(merged, hidden, ExtractParams(**EXTRACT, store="supervised"), TARGET)
    assert "extracting again" in capsys.readouterr().out
    meta = json.loads((hidden / "meta.json").read_text())
    assert meta["store"] == "supervised" and meta["fingerprint"] != before
    index = pq.read_table(hidden / "index.parquet").to_pylist()
    assert index == pq.read_table(stores["supervised"] / "index.parquet").to_pylist()


def shard_bytes(hidden_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in shard_files(hidden_dir)}


def test_a_changed_store_that_fails_keeps_the_shards_it_has_not_replaced(
    stores, tmp_path, monkeypatch
):
    """Each earlier shard stays until this run's shard of its number lands: a run under other
    settings that fails after its first shard leaves every other shard as it was; the run then
    completed leaves exactly a fresh extraction's shards."""
    hidden = tmp_path / "hidden"
    shutil.copytree(stores["all"], hidden)
    earlier, fresh = shard_bytes(hidden), shard_bytes(stores["supervised"])
    assert len(earlier) >= 3
    supervised = ExtractParams(**EXTRACT, store="supervised")
    rows = extract_stage.shard_rows

    def failing_after_one(*args):
        for n, item in enumerate(rows(*args)):
            if n == 1:
                raise OSError("disk gone")
            yield item

    with monkeypatch.context() as m:
        m.setattr(extract_stage, "shard_rows", failing_after_one)
        with pytest.raises(OSError, match="disk gone"):
            extract(stores["all"].parent / "merged", hidden, supervised, TARGET)
    now = shard_bytes(hidden)
    assert set(now) == set(earlier)
    assert all(now[k] in (earlier[k], fresh.get(k)) for k in now)  # as it was, or replaced
    assert sum(now[k] == earlier[k] for k in now) >= len(earlier) - 1
    extract(stores["all"].parent / "merged", hidden, supervised, TARGET)
    assert shard_bytes(hidden) == fresh
