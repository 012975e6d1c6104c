"""The capture interface (stages/capture/interface.py `Capture`) held by both engines.

The same contract runs against the `hf` engine and against the `sglang` engine, on tiny random
Llama and DeepSeek-V3 targets built here: aux is HF hidden_states[i] at every recorded index i,
side by side, and last is the post-norm final state. The sglang engine runs on
tests/fake_sglang, stand-ins of a release of the first and of the last runner API (0.5.14 and
0.5.23) held to the releases' own signatures, whose model runner computes with the HF model and
captures the layers as SGLang's model code does, so an id the engine gets wrong comes back as
another layer's features. Then: ids per family and release, batching by length and the split of
the flat output, the version check,
resume, rank-0-only writes under torchrun for each release, the canary, and
the hf engine's packed rows through the stage (each sample as if run alone, the same bytes
whatever the writer threads) and its pipelined host copies.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors import safe_open

from stages.artifacts import hidden
from stages.capture import comparison as canary_math
from stages.capture import sglang_runner as sglang_capture
from stages.capture.buffers import FeatureBuffers
from stages.capture.hf import HFCapture
from stages.capture.interface import Capture, Role
from stages.capture.packing import packed_rows
from stages.capture.served import prefill_aux
from stages.capture.shards import ShardCapture, leading_rows, timed_rate
from stages.cli import StageError
from stages.commands import canary
from stages.drafter.layers import serving_layer_ids, sglang_captured_indices
from stages.extract import extract
from stages.params.extract import ExtractCanaryParams, ExtractParams, ExtractSGLangParams
from stages.params.schema import build
from stages.params.target import TargetParams
from stages.runtime.errors import ParamsError
from stages.runtime.files import CHECKSUM_SUFFIX
from stages.target_model.model import load_causal_lm
from stages.wiring.capture import build_capture
from tests import fake_sglang
from tests.conftest import ROOT
from tests.mla_target import k25_layout

from .conftest import CONFIGS, SMALL, write_merged

pytestmark = pytest.mark.timeout(300)
RELEASES = fake_sglang.STAND_INS

SAMPLES = [list(range(3, 9)), [7] * 3 + list(range(40, 77)), list(range(90, 117)), [5, 6]]


def target_params(path: Path) -> TargetParams:
    return TargetParams(path=str(path), device="cpu", cpu_threads=1)


def extract_params(engine: str, layers=None, dtype="float32", **sglang) -> ExtractParams:
    return ExtractParams(
        engine=engine,
        layers=layers,
        dtype=dtype,
        batch_tokens=96,
        shard_tokens=60,
        sglang=ExtractSGLangParams(**{"tp_size": 1, "max_tokens_per_forward": 64, **sglang}),
    )


def make_capture(
    engine, path, fake, layers=None, dtype="float32", release="0.5.23", **sglang
) -> Capture:
    if engine == "sglang":
        fake(release)
    return build_capture(extract_params(engine, layers, dtype, **sglang), target_params(path))


def reference(path: Path, ids: list[int]):
    """HF's own hidden states of one sequence, run alone: (hidden_states tuple, fp32)."""
    model = load_causal_lm(str(path), device="cpu", dtype="float32")
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states


def captured(capture: Capture, samples) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    out = {}
    for pos, aux, last in capture.capture(samples):
        assert pos not in out
        out[pos] = (aux.clone(), last.clone())
    assert sorted(out) == list(range(len(samples)))
    return out


def assert_is_hf(path: Path, samples, got, indices) -> None:
    H = SMALL["hidden_size"]
    for pos, ids in enumerate(samples):
        states = reference(path, ids)
        aux, last = got[pos]
        assert aux.shape == (len(ids), len(indices) * H) and last.shape == (len(ids), H)
        for j, i in enumerate(indices):
            torch.testing.assert_close(
                aux[:, j * H : (j + 1) * H].float(), states[i][0], atol=1e-5, rtol=1e-5
            )
        torch.testing.assert_close(last.float(), states[-1][0], atol=1e-5, rtol=1e-5)


# --- the contract, both engines ------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "deepseek"])
@pytest.mark.parametrize("engine", ["hf", *(f"sglang-{v}" for v in RELEASES)])
def test_capture_contract(engine, family, targets, fake):
    """0.5.14 returns no post-norm state beside the aux layers (the engine reads it at the
    logits processor), 0.5.23 does (last_hidden_states): both give HF's."""
    engine, _, release = engine.partition("-")
    capture = make_capture(engine, targets[family], fake, release=release or "0.5.23")
    assert isinstance(capture, Capture)
    assert capture.aux_indices == [2, 4, 5]  # the default [2, N // 2, N - 3] of 8 layers
    assert (capture.num_layers, capture.hidden_size) == (8, SMALL["hidden_size"])
    assert capture.architecture == CONFIGS[family]().architectures[0]
    assert capture.dtype == torch.float32 and capture.role == Role(0, 1, True)
    got = captured(capture, SAMPLES)
    assert all(a.dtype == torch.float32 and a.device.type == "cpu" for a, _ in got.values())
    assert_is_hf(targets[family], SAMPLES, got, [2, 4, 5])


@pytest.mark.parametrize("engine", ["hf", "sglang"])
def test_features_come_back_in_the_stored_dtype(engine, targets, fake):
    capture = make_capture(engine, targets["llama"], fake, layers=[1, 3, 6], dtype="bfloat16")
    got = captured(capture, SAMPLES[:2])
    states = reference(targets["llama"], SAMPLES[1])
    aux, last = got[1]
    assert aux.dtype == last.dtype == torch.bfloat16
    torch.testing.assert_close(aux[:, 32:64].float(), states[3][0], atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("release", RELEASES)
def test_sglang_captures_kimi_k25s_own_class(release, targets, fake, tmp_path):
    """Kimi-K2.5's checkpoint names KimiK25ForConditionalGeneration, a multimodal wrapper with
    no logits processor of its own (its DeepSeek-V3 language model has it), which SGLang loads
    from its layout: the features are those of the same weights as a plain DeepSeek-V3."""
    k25 = k25_layout(targets["deepseek"], tmp_path / "k25")
    capture = make_capture("sglang", k25, fake, release=release)
    assert capture.architecture == "KimiK25ForConditionalGeneration"
    assert capture.aux_indices == [2, 4, 5]
    assert_is_hf(targets["deepseek"], SAMPLES, captured(capture, SAMPLES), [2, 4, 5])


# --- the sglang engine: ids, batches, settings, version -----------------------------------


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize(
    "family, layers, ids",
    [
        ("llama", [2, 4, 5], [1, 3, 4]),  # llama.py: id + 1
        ("llama", [1, 3, 7], [0, 2, 6]),
        ("deepseek", [2, 4, 5], [1, 3, 4]),  # deepseek_v2.py: the first id is 1, so + 1
        ("deepseek", [3, 4, 6], [3, 4, 6]),  # otherwise as written
    ],
)
@pytest.mark.slow
def test_sglang_ids_per_family_and_release(family, layers, ids, version, targets, fake):
    record = fake(version)
    capture = build_capture(extract_params("sglang", layers), target_params(targets[family]))
    assert capture.layer_ids == ids and capture.version == version
    (told,) = [r for r in record.RECORD if r["event"] == "set_eagle3_layers_to_capture"]
    assert told["ids"] == ids and told["captures"] == layers
    assert_is_hf(targets[family], SAMPLES[:2], captured(capture, SAMPLES[:2]), layers)


def test_an_id_convention_mistake_comes_back_as_other_layers(targets, fake, monkeypatch):
    """The engine translating with the convention of SGLang < 0.5.13 (id + 1 for DeepSeek) while
    0.5.23 runs: every layer one too shallow."""
    record = fake()
    older = "0.5.12"
    monkeypatch.setattr(
        sglang_capture, "serving_layer_ids", lambda a, i, n, v: serving_layer_ids(a, i, n, older)
    )
    monkeypatch.setattr(
        sglang_capture,
        "sglang_captured_indices",
        lambda a, ids, n, v: sglang_captured_indices(a, ids, n, older),
    )
    capture = build_capture(extract_params("sglang", [3, 4, 6]), target_params(targets["deepseek"]))
    (told,) = [r for r in record.RECORD if r["event"] == "set_eagle3_layers_to_capture"]
    assert told["ids"] == [2, 3, 5] and told["captures"] == [2, 3, 5]
    got = captured(capture, SAMPLES[:1])
    states = reference(targets["deepseek"], SAMPLES[0])
    assert torch.allclose(got[0][0][:, :32], states[2][0], atol=1e-5)  # slot 0 holds index 2


def test_sglang_forwards_group_samples_by_length_and_count_in_order():
    """The grouping the sglang engine's forwards use (packing.packed_rows, the hf engine's too),
    with the request pool's cap on samples."""
    rows = [list(r) for r in packed_rows([30, 50, 40, 120, 10], 100)]
    assert rows == [[0, 1], [2], [3], [4]]
    assert [list(r) for r in packed_rows([10] * 5, 100, max_samples=2)] == [[0, 1], [2, 3], [4]]
    assert packed_rows([200], 100) == [range(1)] and packed_rows([], 100) == []


@pytest.mark.parametrize("release", RELEASES)
def test_sglang_batches_by_length_and_splits_the_flat_output(release, targets, fake, monkeypatch):
    record = fake(release)
    samples = [SAMPLES[0] * 5, SAMPLES[1] + SAMPLES[3], SAMPLES[2] + SAMPLES[0], SAMPLES[3]]
    lengths = [len(s) for s in samples]  # 30, 42, 33, 2
    capture = make_capture(
        "sglang", targets["llama"], fake, release=release, max_tokens_per_forward=75
    )
    got = captured(capture, samples)
    forwards = [r["lengths"] for r in record.RECORD if r["event"] == "forward"]
    assert forwards == [lengths[:2], lengths[2:]]  # 72 tokens, then 35
    assert all(r["mode"] == "FULL" for r in record.RECORD if r["event"] == "forward")
    assert_is_hf(targets["llama"], samples, got, [2, 4, 5])
    # the runner's max_running_requests bounds a forward's samples too
    fake(release)
    monkeypatch.setattr("fake_core.POOL_SIZE", 3)
    record.RECORD.clear()
    params = extract_params("sglang", max_tokens_per_forward=10**6)
    captured(build_capture(params, target_params(targets["llama"])), samples)
    assert [len(r["lengths"]) for r in record.RECORD if r["event"] == "forward"] == [3, 1]


@pytest.mark.parametrize("release", RELEASES)
def test_sglang_engine_runs_with_capture_settings(release, targets, fake):
    record = fake(release)
    capture = make_capture(
        "sglang", targets["llama"], fake, release=release, mem_fraction_static=0.5
    )
    captured(capture, SAMPLES[:1])
    (args,) = [r for r in record.RECORD if r["event"] == "server_args"]
    assert args["disable_radix_cache"] is True and args["chunked_prefill_size"] == -1
    assert args["pp_size"] == 1 and args["disable_cuda_graph"] is True
    assert (args["tp_size"], args["ep_size"], args["mem_fraction_static"]) == (1, 1, 0.5)
    (runner,) = [r for r in record.RECORD if r["event"] == "model_runner"]
    assert runner["mem_fraction_static"] == 0.5
    initialized = {r["what"] for r in record.RECORD if r["event"] == "initialize"}
    if release == "0.5.14":
        assert (runner["tp_rank"], runner["pp_size"], runner["moe_ep_size"]) == (0, 1, 1)
        assert initialized == {"moe", "fp8", "fp4"}
    else:  # capture-only settings, published before the runner, groups built once
        assert args["enable_return_aux_hidden_states"] is True
        assert args["speculative_algorithm"] == "EAGLE3"
        assert args["return_aux_hidden_state_layer_ids"] == [1, 3, 4]
        events = [r["event"] for r in record.RECORD]
        assert events.index("publish") < events.index("init_parallel_runtime")
        assert events.index("init_parallel_runtime") < events.index("model_runner")
        assert initialized == {"moe", "fp8", "bf16", "fp4"}


def test_sglang_tp_size_must_match_the_processes(targets, fake):
    with pytest.raises(StageError, match=r"extract.sglang: tp_size is 2 but 1 process"):
        make_capture("sglang", targets["llama"], fake, tp_size=2)


@pytest.mark.parametrize("version", ["0.5.13", "0.5.14.post1", "0.5.24", None])
def test_version_check_names_the_supported_range(version, targets, fake, tmp_path):
    if version is None:
        fake_sglang.forget()  # nothing installed
    else:
        fake(version, package="0.5.23")
    params = extract_params("sglang")
    with pytest.raises(StageError) as err:
        extract(tmp_path / "merged", tmp_path / "hidden", params, target_params(targets["llama"]))
    message = str(err.value)
    assert message.startswith("extract.sglang: ")
    assert "0.5.14 to 0.5.23" in message and 'pip install "sglang==0.5.23"' in message
    if version:
        assert f"{version} is installed" in message
    assert not (tmp_path / "hidden").exists()


def test_sglang_params_are_validated():
    with pytest.raises(ParamsError, match="ep_size 3 must divide tp_size 8"):
        ExtractSGLangParams(ep_size=3)
    for share in (0, 1.0, 1.5):  # the whole GPU leaves nothing for activations
        with pytest.raises(ParamsError, match=r"mem_fraction_static.*allowed: > 0 and < 1"):
            ExtractSGLangParams(mem_fraction_static=share)
    assert ExtractSGLangParams(mem_fraction_static=0.99).mem_fraction_static == 0.99
    with pytest.raises(ParamsError, match="canary.url"):
        ExtractCanaryParams(reference="http")
    with pytest.raises(ParamsError, match="engine"):
        build(ExtractParams, {"engine": "vllm"}, "extract")


# --- the extract stage on the sglang engine: artifact, resume ------------------------------


def shard_tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def assert_hidden_is_hf(target: Path, merged: Path, out: Path, indices: list[int]) -> None:
    index = pq.read_table(out / hidden.INDEX).to_pylist()
    rows = {
        r["sample_id"]: r["input_ids"]
        for split in ("train", "eval")
        for r in pq.read_table(merged / f"{split}.parquet").to_pylist()
    }
    assert len(index) == len(rows)
    shards: dict[int, dict] = {}
    got = {}
    for r in index:
        t = shards.setdefault(r["shard"], shard_tensors(hidden.shard_path(out, r["shard"])))
        s = slice(r["offset"], r["offset"] + r["length"])
        assert t["input_ids"][s].tolist() == rows[r["sample_id"]]
        got[r["sample_id"]] = (t["aux"][s], t["last"][s])
    names = sorted(got)
    assert_is_hf(target, [rows[n] for n in names], dict(enumerate(got[n] for n in names)), indices)


@pytest.mark.slow
def test_extract_with_the_sglang_engine_resumes_shard_by_shard(targets, fake, tmp_path, capsys):
    record = fake()
    merged = write_merged(tmp_path / "merged")
    out = tmp_path / "hidden"
    params = extract_params("sglang", [1, 3, 6])
    report = extract(merged, out, params, target_params(targets["llama"]))
    assert report.engine == "sglang" and report.extracted_tokens == report.tokens
    meta = json.loads((out / hidden.META).read_text())
    assert meta["engine"] == "sglang" and meta["sglang_version"] == "0.5.23"
    assert meta["aux_hf_indices"] == [1, 3, 6] and meta["sglang_capture_ids"] == [0, 2, 5]
    assert_hidden_is_hf(targets["llama"], merged, out, [1, 3, 6])
    printed = capsys.readouterr().out
    assert "GiB per writing process" in printed and "hours" in printed

    shards = hidden.shard_files(out)
    assert len(shards) >= 3
    stamps = {p: p.stat().st_mtime_ns for p in shards}
    shards[1].unlink()
    record.RECORD.clear()
    fake()  # a new process
    again = extract(merged, out, params, target_params(targets["llama"]))
    assert shards[1].exists() and again.extracted_tokens < again.tokens
    assert all(p.stat().st_mtime_ns == stamps[p] for p in shards if p != shards[1])
    forwarded = sum(r["tokens"] for r in record.RECORD if r["event"] == "forward")
    n1 = shard_tensors(shards[1])["input_ids"].numel()
    assert n1 <= forwarded <= 3 * n1  # that shard (and the timed batch, drawn from it) only
    assert_hidden_is_hf(targets["llama"], merged, out, [1, 3, 6])


# --- the hf engine: packed rows, host copies and writers -----------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_hf_engine_shards_hold_each_sample_as_run_alone_whatever_the_writers(
    dtype, targets, tmp_path
):
    """Samples packed into rows of up to 96 tokens: every stored sample is HF's hidden states of
    that sample run alone (fp32), and the shards are the same bytes with one writer thread or
    three, and written again."""
    merged = write_merged(tmp_path / "merged")
    shards = {}
    for run, writers in (("one", 1), ("three", 3), ("again", 3)):
        params = ExtractParams(shard_tokens=60, batch_tokens=96, dtype=dtype, writers=writers)
        report = extract(merged, tmp_path / run, params, target_params(targets["llama"]))
        assert report.warmup_s > 0 and report.time["loop_s"] > 0
        assert report.time["forward_s"] > 0 and report.time["save_s"] > 0
        shards[run] = [p.read_bytes() for p in hidden.shard_files(tmp_path / run)]
    assert len(shards["one"]) >= 3 and shards["one"] == shards["three"] == shards["again"]
    if dtype == "float32":
        assert_hidden_is_hf(targets["llama"], merged, tmp_path / "one", [2, 4, 5])


def test_shard_capture_hands_a_shard_on_once_the_next_is_queued(targets, fake):
    """The device never waits for the host between shards: shard k is given to the writer after
    shard k + 1's forwards were queued, its features intact in a set of buffers of its own."""
    capture = make_capture("hf", targets["llama"], fake)
    events: list[tuple[str, int]] = []

    class Recording:
        def __getattr__(self, name):
            return getattr(capture, name)

        def capture(self, input_ids):
            events.append(("forward", len(input_ids)))
            return capture.capture(input_ids)

    H = SMALL["hidden_size"]
    buffers = FeatureBuffers(100, 3 * H, H, torch.float32, pin=False, sets=3)
    shards = [(k, [{"input_ids": s} for s in SAMPLES[k : k + 2]]) for k in range(3)]
    given = ShardCapture(Recording(), buffers, torch.device("cpu")).shards(shards)
    for k, rows, tensors in given:
        events.append(("given", k))
        assert rows == shards[k][1]
        ends = torch.tensor([0] + [len(r["input_ids"]) for r in rows]).cumsum(0).tolist()
        got = {
            i: (tensors["aux"][a:b], tensors["last"][a:b])
            for i, (a, b) in enumerate(zip(ends, ends[1:]))
        }
        assert_is_hf(targets["llama"], [r["input_ids"] for r in rows], got, [2, 4, 5])
    assert events == [
        ("forward", 2),
        ("forward", 2),
        ("given", 0),
        ("forward", 2),
        ("given", 1),
        ("given", 2),
    ]


def test_shard_capture_without_buffers_runs_the_forwards_and_keeps_nothing(targets, fake):
    capture = make_capture("hf", targets["llama"], fake)
    rows = [{"input_ids": s} for s in SAMPLES]
    ((k, _, tensors),) = ShardCapture(capture, None, torch.device("cpu")).shards([(0, rows)])
    assert k == 0 and set(tensors) == {"input_ids"}


# --- torchrun: one TP group, rank 0 writes ---------------------------------------------------


def torchrun_extract(tmp_path, release, targets, nproc, sglang, entry, **env) -> tuple:
    """`torchrun --nproc-per-node nproc` of the extract stage (`entry`: `-m` or a wrapper
    script) with the sglang engine of the stand-in of `release` on the DeepSeek-V3 target;
    (the merged samples, the hidden states' folder)."""
    merged = write_merged(tmp_path / "merged")
    where = fake_sglang.write_distribution(tmp_path / "dist", release)
    params = tmp_path / "params.yaml"
    extract = {"engine": "sglang", "layers": [3, 4, 6], "dtype": "float32", "shard_tokens": 60}
    target = {"path": str(targets["deepseek"]), "device": "cpu"}
    params.write_text(yaml.safe_dump({"target": target, "extract": {**extract, "sglang": sglang}}))
    pythonpath = f"{ROOT}:{fake_sglang.pythonpath(release, where)}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath, **env)
    out = tmp_path / "hidden"
    cmd = [Path(sys.executable).parent / "torchrun", "--standalone", "--nproc-per-node", nproc]
    cmd += [entry, "stages.extract", "--params", params, "--merged", merged, "--out", out]
    cmd += ["--report", tmp_path / "reports" / "extract.json"]
    proc = subprocess.run(
        list(map(str, cmd)), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return merged, out


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("release", RELEASES)
def test_torchrun_of_one_rank_gives_the_runner_a_group(release, targets, tmp_path):
    """`torchrun --nproc-per-node 1` (a one-GPU node following the README): the stage starts the
    process group, so the runner does not start its own against torchrun's agent store."""
    merged, out = torchrun_extract(tmp_path, release, targets, 1, {"tp_size": 1}, "-m")
    assert_hidden_is_hf(targets["deepseek"], merged, out, [3, 4, 6])


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("release", RELEASES)
def test_torchrun_tensor_parallel_ranks_only_rank_0_writes(release, targets, tmp_path):
    record = tmp_path / "record"
    record.mkdir()
    merged, out = torchrun_extract(
        tmp_path,
        release,
        targets,
        2,
        {"tp_size": 2, "ep_size": 2, "max_tokens_per_forward": 64},
        ROOT / "tests" / "dist_fixtures" / "record_writes.py",
        RECORD_DIR=str(record),
        RECORD_ROOT=str(tmp_path),
        FAKE_SGLANG_RECORD=str(tmp_path / "fake-{rank}.jsonl"),
    )

    def written(rank: int) -> list[str]:
        log = record / f"writes-{rank}.tsv"
        lines = log.read_text().splitlines() if log.exists() else []
        return [Path(line.split("\t")[1]).name for line in lines]

    shards = [p.name for p in hidden.shard_files(out)]
    assert len(shards) >= 3
    assert written(1) == []  # the second TP rank ran every forward and wrote nothing
    checked = shards + ["index.parquet"]  # each with its size and sha256 beside it
    assert sorted(n for n in written(0) if n != "extract.json") == sorted(
        checked + [name + CHECKSUM_SUFFIX for name in checked] + ["meta.json"]
    )
    fake_records = [
        [json.loads(line) for line in (tmp_path / f"fake-{r}.jsonl").read_text().splitlines()]
        for r in (0, 1)
    ]
    runners = [[e for e in rec if e["event"] == "model_runner"][0] for rec in fake_records]
    if release == "0.5.14":  # the ranks go to the runner
        ranks = [(r["tp_rank"], r["tp_size"], r["moe_ep_rank"], r["moe_ep_size"]) for r in runners]
        assert ranks == [(0, 2, 0, 2), (1, 2, 1, 2)]
    else:  # they are published with the ServerArgs, the runner reads them back
        published = [[e for e in rec if e["event"] == "publish"][0] for rec in fake_records]
        assert [(p["world_rank"], p["gpu_id"]) for p in published] == [(0, 0), (1, 1)]
        args = [[e for e in rec if e["event"] == "server_args"][0] for rec in fake_records]
        assert [(a["tp_size"], a["ep_size"]) for a in args] == [(2, 2), (2, 2)]
    forwards = [[e["lengths"] for e in rec if e["event"] == "forward"] for rec in fake_records]
    assert forwards[0] == forwards[1] and len(forwards[0]) >= len(shards)
    assert_hidden_is_hf(targets["deepseek"], merged, out, [3, 4, 6])


# --- the canary ------------------------------------------------------------------------------


def residual_stream() -> dict[int | str, torch.Tensor]:
    """Hidden states 1..7 of 20 tokens, each layer a small step from the last."""
    g = torch.Generator().manual_seed(0)
    states: dict = {i: torch.randn(20, 8, generator=g) * (1 + i) for i in range(1, 8)}
    for i in range(2, 8):
        states[i] = states[i - 1] + 0.05 * torch.randn(20, 8, generator=g)
    return states


def test_compare_catches_a_one_layer_shift_and_passes_when_equal():
    states = residual_stream()
    no_noise = dict.fromkeys([*states, "last"], 0.0)
    aux = torch.cat([states[i] for i in (2, 4, 5)], dim=-1)
    equal = canary_math.compare(aux, states[7], states, states[7], [2, 4, 5], no_noise, 0.05)
    assert equal.passed and all(s.rel_error == 0 for s in equal.slots)
    shifted = torch.cat([states[i] for i in (3, 5, 6)], dim=-1)
    report = canary_math.compare(shifted, states[7], states, states[7], [2, 4, 5], no_noise, 0.5)
    assert not report.passed  # under the threshold, yet closer to the next layer
    assert [s.best_index for s in report.slots] == [3, 5, 6]
    assert "FAIL" in "\n".join(report.lines())


def test_each_threshold_is_the_margin_times_its_floor_and_the_floor_is_printed():
    """A slot 3x its floor away passes, one 5x away fails; a floor of 0 still leaves the least
    threshold, so a reference that batches without a trace does not fail every other kernel."""
    states = residual_stream()
    g = torch.Generator().manual_seed(1)
    # a second run 1e-2 away (relative) at every index
    noisy = {i: x + 1e-2 * x.norm() * torch.randn(x.shape, generator=g) / x.numel() ** 0.5
             for i, x in states.items()}  # fmt: skip
    floor = canary_math.floors(states, [noisy], torch.float32)
    assert all(5e-3 < floor[i] < 2e-2 for i in (2, 4, 5)), floor
    margin = canary_math.FLOOR_MARGIN
    near = {i: states[i] + (noisy[i] - states[i]) * (margin - 1) for i in states}
    far = {i: states[i] + (noisy[i] - states[i]) * (margin + 1) for i in states}
    for got, passes in ((near, True), (far, False)):
        aux = torch.cat([got[i] for i in (2, 4, 5)], dim=-1)
        report = canary_math.compare(aux, None, states, None, [2, 4, 5], floor)
        assert report.passed is passes
        assert [s.threshold for s in report.slots] == [margin * floor[i] for i in (2, 4, 5)]
    printed = "\n".join(report.lines())
    assert "floor" in printed and f"{floor[2]:.1e}" in printed
    zero = canary_math.compare(aux, None, states, None, [2, 4, 5], dict.fromkeys(states, 0.0))
    assert all(s.threshold == canary_math.MIN_THRESHOLD for s in zero.slots)


class ShiftedCapture(HFCapture):
    """An hf capture that says it holds [2, 4, 5] but hooks [3, 5, 6]: the one-layer mistake."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aux_indices = [i - 1 for i in self.extractor.aux_indices]


def canary_params(tmp_path: Path, target: Path, engine: str, **extract) -> Path:
    path = tmp_path / "params.yaml"
    body = {"engine": engine, "dtype": "float32", "sglang": {"tp_size": 1}, **extract}
    path.write_text(
        yaml.safe_dump({"target": {"path": str(target), "device": "cpu"}, "extract": body})
    )
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "deepseek"])
def test_canary_passes_the_sglang_engine_and_fails_a_shifted_capture(
    family, targets, fake, tmp_path
):
    fake()
    ext = extract_params("sglang", [3, 4, 6])
    target = target_params(targets[family])
    report = canary.run_canary(build_capture(ext, target), SAMPLES, ext, target)
    assert report is not None and report.passed and report.last is not None
    assert report.last.rel_error < 1e-5 and report.last.threshold == canary_math.MIN_THRESHOLD
    model = load_causal_lm(str(targets[family]), device="cpu", dtype="float32")
    shifted = ShiftedCapture(model, [3, 5, 6], torch.float32, 96)
    report = canary.run_canary(shifted, SAMPLES, extract_params("hf", [2, 4, 5]), target)
    assert report is not None and not report.passed
    assert [s.best_index for s in report.slots] == [3, 5, 6]


@pytest.mark.parametrize("release", RELEASES)
def test_canary_holds_kimi_k25s_own_class_to_the_same_weights_as_deepseek_v3(
    release, targets, fake, tmp_path
):
    """transformers cannot load Kimi-K2.5's wrapper: the hf reference reads the same weights
    from a plain DeepseekV3ForCausalLM checkpoint (--reference-path), and the sglang engine on
    the wrapper passes against it; the wrong weights fail."""
    fake(release)
    k25 = k25_layout(targets["deepseek"], tmp_path / "k25")
    ext = extract_params("sglang", [2, 4, 5])
    target = target_params(k25)
    capture = build_capture(ext, target)
    same = canary.run_canary(capture, SAMPLES, ext, target, reference_path=str(targets["deepseek"]))
    assert same is not None and same.passed
    assert same.last is not None and same.last.rel_error < 1e-5
    other = canary.run_canary(capture, SAMPLES, ext, target, reference_path=str(targets["llama"]))
    assert other is not None and not other.passed


@pytest.mark.slow
def test_canary_cli_exits_1_on_a_version_mistake(targets, fake, tmp_path, monkeypatch, capsys):
    merged = write_merged(tmp_path / "merged")
    params = canary_params(tmp_path, targets["deepseek"], "sglang", layers=[3, 4, 6])
    fake()
    canary.main(merged, samples=3, params=params)  # right ids: passes
    assert "[canary] PASS" in capsys.readouterr().out
    fake()  # the engine translates with SGLang 0.5.12's convention while 0.5.23 runs
    monkeypatch.setattr(
        sglang_capture, "serving_layer_ids", lambda a, i, n, v: serving_layer_ids(a, i, n, "0.5.12")
    )
    monkeypatch.setattr(
        sglang_capture,
        "sglang_captured_indices",
        lambda a, ids, n, v: sglang_captured_indices(a, ids, n, "0.5.12"),
    )
    with pytest.raises(StageError, match="canary failed"):
        canary.main(merged, samples=3, params=params)
    printed = capsys.readouterr().out
    assert "FAIL" in printed and "closest index" in printed


class AuxServer(http.server.ThreadingHTTPServer):
    """/generate as a SGLang >= 0.5.23 server with --enable-return-aux-hidden-states answers it:
    meta_info.hidden_states[0] is the prefill's aux layers, at the HF indices it was told."""

    def __init__(self, model, indices: list[int]):
        self.model, self.indices = model, indices
        self.requests: list[dict] = []
        super().__init__(("127.0.0.1", 0), AuxHandler)


class AuxHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server: AuxServer = self.server  # type: ignore[assignment]
        server.requests.append(body)
        with torch.no_grad():
            states = server.model(
                input_ids=torch.tensor([body["input_ids"]]), output_hidden_states=True
            ).hidden_states
        aux = torch.cat([states[i][0] for i in server.indices], dim=-1)
        reply = json.dumps({"text": "", "meta_info": {"hidden_states": [aux.tolist()]}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("served, passes", [([2, 4, 5], True), ([3, 5, 6], False)])
def test_canary_against_a_served_capture(served, passes, targets, tmp_path):
    model = load_causal_lm(str(targets["llama"]), device="cpu", dtype="float32")
    server = AuxServer(model, served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        ext = ExtractParams(
            engine="hf",
            dtype="float32",
            canary=ExtractCanaryParams(reference="http", url=url, max_rel_error=1e-3),
        )
        target = target_params(targets["llama"])
        report = canary.run_canary(build_capture(ext, target), SAMPLES, ext, target)
    finally:
        server.shutdown()
    assert report is not None and report.passed is passes and report.last is None
    assert server.requests[0]["return_hidden_states"] is True
    assert server.requests[0]["input_ids"] == SAMPLES[0]


def test_a_served_capture_missing_its_cached_prefix_is_refused():
    reply = {"meta_info": {"hidden_states": [[[0.0] * 6] * 3]}}
    assert prefill_aux(reply, 3, 6).shape == (3, 6)
    with pytest.raises(Exception, match="disable-radix-cache"):
        prefill_aux(reply, 5, 6)


@pytest.mark.slow
def test_canary_one_node_flow_saves_the_served_states_then_compares(
    targets, fake, tmp_path, capsys
):
    """--save-reference fetches from the server (no engine built); with the server stopped,
    --load-reference compares the engine's capture with what was saved."""
    merged = write_merged(tmp_path / "merged")
    model = load_causal_lm(str(targets["llama"]), device="cpu", dtype="float32")
    server = AuxServer(model, [2, 4, 5])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    canary_extract = {"reference": "http", "url": url, "max_rel_error": 1e-3}
    params = canary_params(tmp_path, targets["llama"], "sglang", canary=canary_extract)
    saved = tmp_path / "reference.pt"
    try:
        canary.main(merged, samples=4, save_reference=saved, params=params)
    finally:
        server.shutdown()
    assert len(server.requests) == 8 and saved.exists()  # one at a time, then all at once
    assert "--return-aux-hidden-state-layer-ids 1 3 4" in capsys.readouterr().out
    fake()
    canary.main(merged, samples=4, load_reference=saved, params=params)
    assert "[canary] PASS" in capsys.readouterr().out
    fake()
    with pytest.raises(StageError, match="other samples"):
        canary.main(merged, samples=3, load_reference=saved, params=params)


def test_the_projection_times_one_batch_after_a_warm_up(targets, fake):
    capture = make_capture("hf", targets["llama"], fake)
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(capture, name)

        def capture(self, input_ids):
            calls.append([len(s) for s in input_ids])
            return capture.capture(input_ids)

    ticks = iter([9.0, 10.0, 12.0])
    rows = [{"input_ids": s} for s in SAMPLES]
    timed = leading_rows(rows, 50)
    assert [len(r["input_ids"]) for r in timed] == [6, 40]  # up to 50 tokens, at least one
    assert leading_rows(rows[1:], 5) == rows[1:2]
    warmup_s, rate = timed_rate(
        Counting(), [r["input_ids"] for r in timed], clock=lambda: next(ticks)
    )
    assert calls == [[6], [6, 40]] and warmup_s == 1.0 and rate == 46 / 2.0
