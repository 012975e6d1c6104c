"""The GPU benchmark scripts keep running: each at a tiny CPU shape through its main(argv)."""

from __future__ import annotations

import argparse
import json
import re
import time

import pytest
import torch
import yaml

from stages.artifacts import hidden
from tests.engines.conftest import free_port
from tests.perf import (
    bench_client_vs_bare,
    bench_demo,
    bench_estimate,
    bench_extract,
    bench_extract_stage,
    bench_kimi_width,
    bench_llama_stages,
    bench_merge,
    bench_multi_gpu,
    bench_train,
)

TINY = [
    "--shape",
    "tiny",
    "--device",
    "cpu",
    "--batches",
    "1x32",
    "2x16",
    "--warmup",
    "1",
    "--repeat",
    "2",
]


def printed_table(text: str, first_column: str) -> list[dict[str, str]]:
    """The rows of the table a script printed last, keyed by its header (cells 2+ spaces apart)."""
    lines = text.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [first_column])
    header, *rows = (re.split(r"\s{2,}", line.strip()) for line in lines[start:])
    assert all(len(row) == len(header) for row in rows), lines[start:]
    return [dict(zip(header, row)) for row in rows]


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


@pytest.mark.slow
def test_bench_train_prints_a_row_per_batch_shape_and_its_profile(capsys):
    bench_train.main(TINY + ["--ttt-steps", "3", "--profile", "6"])
    out = capsys.readouterr().out
    # one profile table per batch shape (which operators head it depends on the machine's load)
    assert out.count("Self CPU time total") == 2
    rules = [i for i, line in enumerate(out.splitlines()) if set(line.strip()) == {"-", " "}]
    tables = [rules[i : i + 3] for i in range(0, len(rules) - 2, 3)]  # above, below header, end
    assert len(tables) == 2 and all(end - below - 1 == 6 for _, below, end in tables)
    rows = printed_table(out, "batch")
    assert [(r["batch"], r["length"]) for r in rows] == [("1", "32"), ("2", "16")]
    for r in rows:
        assert set(r) == {
            "batch",
            "length",
            "attention",
            "tokens/s",
            "ms/step",
            "first step s",
            "labels ms",
            "peak GiB",
            "device",
            "dtype",
            "ttt_steps",
        }
        assert number(r["tokens/s"]) > 0 and number(r["ms/step"]) > 0
        assert r["first step s"] != "" and number(r["first step s"]) >= 0
        assert number(r["labels ms"]) > 0 and number(r["peak GiB"]) > 0
        assert (r["device"], r["dtype"], r["ttt_steps"]) == ("cpu", "fp32", "3")
        assert r["attention"] == "auto"  # the reference on the CPU
        tokens = int(r["batch"]) * int(r["length"])
        assert number(r["tokens/s"]) == pytest.approx(
            tokens / number(r["ms/step"]) * 1e3,
            rel=0.02,
            abs=0.5,  # printed as an integer
        )


@pytest.mark.slow
def test_bench_train_fp8_curve_trains_both_and_prints_both_curves(capsys):
    """--fp8 (emulated on the CPU) times the FP8 step and checks it against float32; --curve
    then trains the same fresh drafter with and without FP8 on the same batches."""
    bench_train.main(TINY[:4] + ["--batches", "1x32", "--ttt-steps", "2", "--fp8", "--check"]
                     + ["--curve", "10"])  # fmt: skip
    out = capsys.readouterr().out
    rows = printed_table(out.split("1x32 auto vs")[0], "batch")
    assert [r["dtype"] for r in rows] == ["fp32 fp8"]
    check = re.search(r"auto vs float32 reference: loss rel diff ([0-9.e+-]+), largest grad "
                      r"rel diff \(norm\) ([0-9.e+-]+)", out)  # fmt: skip
    assert check and 0 < float(check[2]) < 0.5, out  # FP8 rounds: not equal, not far
    curves = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:3] == "  f"}
    assert sorted(curves) == ["fp32", "fp8"] and len(curves["fp8"]) == 10, out
    assert curves["fp32"] != curves["fp8"]
    assert re.search(r"mean of the last 1 steps: fp32 [0-9.]+, fp8 [0-9.]+ \([+-][0-9.]+%\)", out)


def test_bench_train_check_takes_both_paths_labels_from_the_same_target_logits():
    """The check's reference reads the features in float32 but the target's final hidden state as
    stored: given bf16 ones and the same attention both ways, the two paths compute the same
    (from a float32 copy the reference would take its soft labels from other logits)."""
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    objective = bench_train.build_objective("tiny", 3, 0.8, cpu)
    batch = bench_train.random_batch(objective, 2, 16, cpu)
    batch["last"] = batch["last"].bfloat16()
    check = bench_train.compare_with_reference(objective, batch, impl="reference")
    assert check.startswith("loss rel diff 0.00e+00, largest grad rel diff (norm) 0.00e+00"), check


def test_bench_train_times_dflash_and_checks_it_on_the_same_anchors(capsys):
    """--family dflash times DFlash's step at dflash's default blocks and anchors; --check draws
    the same anchors for both paths (at 600 tokens the 512 anchors are a random subset: two draws
    would differ), so on the CPU, float32 both ways, loss and gradients are equal."""
    bench_train.main(TINY[:4] + ["--family", "dflash", "--batches", "1x600", "--check"]
                     + ["--warmup", "0", "--repeat", "1"])  # fmt: skip
    out = capsys.readouterr().out
    assert "tiny dflash drafter" in out and "blocks of 16, 512 anchors a sample" in out, out
    rows = printed_table(out.split("1x600 auto vs")[0], "batch")
    assert [(r["batch"], r["length"], r["dtype"]) for r in rows] == [("1", "600", "fp32")]
    assert number(rows[0]["tokens/s"]) > 0
    assert rows[0]["labels ms"] == rows[0]["ttt_steps"] == "-"  # EAGLE-3's columns
    check = re.search(r"1x600 auto vs float32 reference: loss rel diff ([0-9.e+-]+), "
                      r"largest grad rel diff \(norm\) ([0-9.e+-]+)", out)  # fmt: skip
    assert check and float(check[1]) == float(check[2]) == 0, out
    with pytest.raises(SystemExit):  # EAGLE-3's loss curves
        bench_train.main(TINY[:4] + ["--family", "dflash", "--curve", "3"])
    assert "leave it out with dflash" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_train_compile_times_the_compiled_objective_after_its_check(
    capsys, monkeypatch, compile_without_codegen
):
    """--compile times the objective as train.compile runs it; --check then runs that compiled
    graph against float32 (after the timings, and compiling nothing: the float32 reference runs
    eager), so its kernels cannot push the timed ones past the recompile limit."""
    import torch._dynamo

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    calls, compile_objective = [], bench_train.compiled_objective

    def counted(model):  # the compiled module itself (it has no truth value), its calls counted
        compiled = compile_objective(model)
        compiled.register_forward_pre_hook(lambda _, args: calls.append(len(args[0]["input_ids"])))
        return compiled

    monkeypatch.setattr(bench_train, "compiled_objective", counted)
    compile_parts_as_a_gpu_does(monkeypatch)
    bench_train.main(TINY[:4] + ["--batches", "1x32", "--ttt-steps", "2", "--compile", "--check"]
                     + ["--warmup", "2", "--repeat", "3"])  # fmt: skip
    out = capsys.readouterr().out
    rows = printed_table(out.split("1x32 auto vs")[0], "batch")
    assert [(r["batch"], r["dtype"]) for r in rows] == [("1", "fp32 compiled")]
    assert number(rows[0]["tokens/s"]) > 0
    # the first step compiles (seconds), the timed ones run the compiled graph: several times
    # faster, also when other work shares the cores
    assert number(rows[0]["first step s"]) > 4 * number(rows[0]["ms/step"]) / 1e3
    check = re.search(r"1x32 auto vs float32 reference: loss rel diff ([0-9.e+-]+),", out)
    assert check and float(check[1]) < 1e-5, out
    assert out.index("tokens/s") < out.index("auto vs float32")
    assert counts["stats"]["unique_graphs"] == 1, dict(counts["stats"])  # the timed graph only
    assert len(calls) == 1 + 1 + 3 + 1, calls  # first step, the other warm-up, timed, the check


def compile_parts_as_a_gpu_does(monkeypatch) -> None:
    """`compiled_on_gpu` compiling here too (dynamo's eager backend: graphs counted, nothing
    built), so that a float32 reference calling the GPU's compiled parts shows up as graphs."""
    from stages.drafter import model, ttt

    parts: dict = {}

    def on_any_device(fn, on_gpu: bool):
        if torch.compiler.is_compiling():
            return fn
        return parts.setdefault(fn, torch.compile(fn, dynamic=True, backend="eager"))

    monkeypatch.setattr(model, "compiled_on_gpu", on_any_device)
    monkeypatch.setattr(ttt, "compiled_on_gpu", on_any_device)


@pytest.mark.slow
def test_bench_train_compile_trains_the_fp8_curve_compiled(capsys, compile_without_codegen):
    """--compile --curve: both curves' drafters run the compiled objective (a GPU's eager FP8
    step is slow), each its own graph beside the timed one."""
    import torch._dynamo

    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    bench_train.main(TINY[:4] + ["--batches", "1x32", "--ttt-steps", "2", "--compile", "--fp8"]
                     + ["--curve", "4"])  # fmt: skip
    out = capsys.readouterr().out
    curves = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line[:3] == "  f"}
    assert sorted(curves) == ["fp32", "fp8"] and len(curves["fp8"]) == 4, out
    assert counts["stats"]["unique_graphs"] == 3, dict(counts["stats"])  # timed, fp32, fp8


def test_bench_extract_prints_rate_and_share_of_peak(capsys):
    bench_extract.main(TINY)
    rows = printed_table(capsys.readouterr().out, "variant")
    assert [(r["variant"], r["batch"], r["length"]) for r in rows] == [
        ("eager", "1", "32"),
        ("eager", "2", "16"),
    ]
    for r in rows:
        assert {"tokens/s", "ms/call", "TFLOP/s", "% of 989", "peak GiB"} <= set(r)
        assert number(r["tokens/s"]) > 0 and number(r["TFLOP/s"]) > 0
        assert (r["% of 989"], r["device"], r["dtype"]) == ("-", "cpu", "float32")


@pytest.mark.slow
def test_bench_extract_stage_times_the_forward_and_the_stage(tmp_path, capsys):
    """The forward alone and the real extract stage in one process at a tiny CPU shape: both
    rates and their ratio, the loop's time by part, the shards after the first two deleted
    behind the stage, the kept ones' features those of each sample run alone."""
    args = ["--shape", "tiny", "--device", "cpu", "--samples", "24", "--lengths", "16", "48"]
    args += ["--batch-tokens", "128", "--shard-tokens", "256", "--forward-batch", "2x32"]
    args += ["--warmup", "1", "--repeat", "2", "--writers", "2", "--work", str(tmp_path / "w")]
    args += ["--json-out", str(tmp_path / "stage.json")]
    results = bench_extract_stage.main(args)
    rows = printed_table(capsys.readouterr().out, "run")
    assert [r["run"] for r in rows] == [
        "forward alone 2x32",
        "stage",
        "stage, before its last writes",
    ]
    s, forward = results["stage"], results["forward"]
    for r, rate in zip(rows, (forward["tokens_per_s"], s["tokens_per_s"])):
        assert rate > 0 and number(r["tokens/s"]) == pytest.approx(rate, abs=0.5)
    ratio = s["tokens_per_s"] / forward["tokens_per_s"]
    assert rows[1]["x forward"] == f"{ratio:.2f}"
    assert results["stage_vs_forward"] == pytest.approx(ratio, abs=1e-3)
    assert s["extracted_tokens"] == s["tokens"] == number(rows[1]["tokens"])
    t = s["time"]  # the last writes: a part of the loop, after which the rate is the stage's
    assert 0 < t["last_writes_s"] < t["loop_s"]
    steady = s["extracted_tokens"] / (t["loop_s"] - t["last_writes_s"])
    assert number(rows[2]["tokens/s"]) == pytest.approx(steady, rel=1e-2)
    assert results["stage_before_last_writes_vs_forward"] == pytest.approx(  # 3 decimals
        steady / forward["tokens_per_s"], rel=1e-2, abs=1e-3
    )
    assert s["shards"] >= 3 and s["shards_deleted"] == s["shards"] - 2
    assert len(hidden.shard_files(tmp_path / "w" / "hidden")) == 2
    assert s["max_rel_error"] < 1e-2  # bf16 storage of each sample's own features
    assert s["warmup_s"] > 0 and s["time"]["forward_s"] > 0 and s["time"]["save_s"] > 0
    assert json.loads((tmp_path / "stage.json").read_text()) == json.loads(json.dumps(results))


def test_forward_flops_counts_layer_weights_and_causal_attention():
    model = bench_extract.build_target("tiny", torch.device("cpu"), torch.float32)
    s = bench_extract.SHAPES["tiny"]
    hidden, q, kv = (
        s["hidden_size"],
        s["num_attention_heads"] * s["head_dim"],
        s["num_key_value_heads"] * s["head_dim"],
    )
    per_layer = hidden * (2 * q + 2 * kv) + 3 * hidden * s["intermediate_size"]
    layers, batch, length = s["num_hidden_layers"], 2, 32
    expected = batch * (2 * layers * per_layer * length + 2 * layers * length**2 * q)
    assert bench_extract.forward_flops(model, batch, length) == expected


@pytest.mark.slow
def test_bench_kimi_width_runs_the_stages_and_prints_oom_rows(tmp_path, capsys, monkeypatch):
    """The real extract, train and export at a tiny DeepSeek-V3 shape; a row whose training runs
    out of GPU memory prints OOM, exports the untrained drafter, and the next row still runs.
    --compile and --batch-size reach the stage's params (the CPU then runs eager, as the stage
    does), and the step is timed on a batch of that size."""
    real_train = bench_kimi_width.run_train
    stage_params = []  # (train.compile, train.batch_size) of each row

    def run_train(work, params, vocab, hidden):
        train = yaml.safe_load(params.read_text())["train"]
        stage_params.append((train["compile"], train["batch_size"]))
        if work.name == "T32":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 17.00 GiB")
        return real_train(work, params, vocab, hidden)

    monkeypatch.setattr(bench_kimi_width, "run_train", run_train)
    args = ["--shape", "tiny", "--device", "cpu", "--lengths", "32", "48"]
    args += ["--samples", "2", "--batch-size", "2", "--train-steps", "1", "--ttt-steps", "2"]
    args += ["--warmup", "0", "--repeat", "1", "--compile"]
    args += ["--work", str(tmp_path / "work"), "--json-out", str(tmp_path / "kimi.json")]
    bench_kimi_width.main(args)
    assert stage_params == [(True, 2), (True, 2)]
    rows = printed_table(capsys.readouterr().out, "length")
    assert [(r["length"], r["batch"], r["stage tok/s"], r["export"]) for r in rows] == [
        ("32", "2", "OOM", "pass (untrained)"),
        ("48", "2", rows[1]["stage tok/s"], "pass"),
    ]
    for r in rows:
        assert number(r["extract tok/s"]) > 0 and r["bytes/token"] == "512"  # 4 x 64 x bf16
        assert number(r["train tok/s"]) > 0 and number(r["ms/step"]) > 0
        assert number(r["train tok/s"]) == pytest.approx(  # the step's batch: 2 samples
            2 * int(r["length"]) / number(r["ms/step"]) * 1e3, rel=0.02
        )
    assert number(rows[1]["stage tok/s"]) > 0 and number(rows[1]["stage peak GiB"]) > 0
    results = json.loads((tmp_path / "kimi.json").read_text())
    assert results["target"]["aux_hf_indices"] == [2, 4, 5]
    assert results["target"]["serving_layer_ids"] == {"sglang": [1, 3, 4], "vllm": [2, 4, 5]}
    assert results["rows"][0]["train"]["error"] == "OOM"
    assert results["rows"][0]["export"]["trained"] is False
    export = results["rows"][1]["export"]
    assert export["check_export"] == "pass" and export["sglang_layer_ids"] == [1, 3, 4]
    assert export["draft"]["head_dim"] == 16 and export["draft"]["rope_scaling"]["factor"] == 64.0


@pytest.mark.slow
def test_bench_merge_builds_raw_data_and_times_the_merge_stage(tmp_path, capsys):
    """Two-turn conversations in the raw schema, merged twice by the stage's own process (the
    second run reuses the data); every sample's last turn is one merged sequence."""
    args = ["--samples", "30", "--datasets", "2", "--turns", "2", "--prompt-len", "3-8"]
    args += ["--output-len", "5-20", "--row-group", "8", "--memory-limit-gb", "2"]
    args += ["--threads", "1", "--repeat", "2", "--work", str(tmp_path)]
    runs = bench_merge.main(args)
    rows = printed_table(capsys.readouterr().out, "samples")
    assert len(rows) == 2 and all(r["samples"] == "30" for r in rows)
    for r, run in zip(rows, runs, strict=True):
        assert r["memory limit GB"] == "2" and number(r["peak RSS GB"]) > 0
        assert number(r["wall s"]) > 0 and number(r["tok/s"]) > 0 and number(r["CPU s"]) > 0
        summary = run["report"]["summary"]
        assert sum(s["samples"] for s in summary.values()) == 30
        assert sum(s["turns"] for s in summary.values()) == 60
    assert number(rows[0]["raw tokens"]) > number(rows[0]["merged tokens"])  # turn 1 twice
    assert not list((tmp_path / "merged").glob(".spill*"))  # the spill folder is removed


@pytest.mark.slow
def test_bench_kimi_width_times_online_training_beside_offline(tmp_path, capsys):
    """A row per feature store at one length: supervised stores fewer bytes per token than all,
    none stores no features and trains online (the target run by the train stage and inside the
    timed step) to the same first loss; every row trains and exports."""
    args = ["--shape", "tiny", "--device", "cpu", "--lengths", "32"]
    args += ["--stores", "all", "supervised", "none", "--samples", "1", "--train-steps", "1"]
    args += ["--ttt-steps", "2", "--warmup", "0", "--repeat", "1", "--work", str(tmp_path)]
    results = bench_kimi_width.main(args)
    rows = printed_table(capsys.readouterr().out, "length")
    assert [(r["store"], r["export"]) for r in rows] == [
        ("all", "pass"),
        ("supervised", "pass"),
        ("none", "pass"),
    ]
    # 4 x 64 x bf16 a row; supervised: the span [4, 32) leaves `last` at 28 of 32 positions
    assert [number(r["bytes/token"]) for r in rows] == [512, (32 * 3 * 128 + 28 * 128) / 32, 0]
    assert all(number(r["train tok/s"]) > 0 and number(r["ms/step"]) > 0 for r in rows)
    losses = [row["train"]["final_loss"] for row in results["rows"]]
    assert losses == pytest.approx([losses[0]] * 3, rel=1e-3)  # bf16 features every way
    assert [row["extract"]["bytes_per_token_all"] for row in results["rows"]] == [512] * 3


def test_batch_shape_names_the_expected_form():
    assert bench_extract.batch_shape("4x2048") == (4, 2048)
    with pytest.raises(argparse.ArgumentTypeError, match="batch x length"):
        bench_extract.batch_shape("4by2048")


@pytest.mark.slow
@pytest.mark.integration
def test_bench_multi_gpu_compares_two_processes_with_one(tmp_path, capsys, monkeypatch):
    """The real stages by 1 process and by torchrun (gloo on CPU): equal shards, equal curves."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    bench_multi_gpu.main(
        [
            "--world",
            "2",
            "--shape",
            "tiny",
            "--device",
            "cpu",
            "--samples",
            "24",
            "--lengths",
            "16",
            "48",
            "--train-steps",
            "6",
            "--batch",
            "4",
            "--batch-tokens",
            "256",
            "--work",
            str(tmp_path / "work"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    equality = results["extract_equality"]
    assert equality["bitwise_equal"] == equality["shards"] >= 8
    assert results["train_loss_gap"] < 1e-4  # fp32 on CPU: equal up to summation order
    assert (
        results["train_2"]["global_batch"] == 4 and results["train_2-scaled"]["global_batch"] == 8
    )
    rows = printed_table(capsys.readouterr().out, "run")
    assert [(r["run"], r["processes"]) for r in rows] == [
        ("extract", "1"),
        ("extract", "2"),
        ("train", "1"),
        ("train, same global batch", "2"),
        ("train, same batch per GPU", "2"),
        ("train, resumed by 1", "1"),
    ]
    assert all(number(r["tokens/s"]) > 0 for r in rows if r["tokens/s"] != "-")


@pytest.mark.slow
@pytest.mark.integration
def test_bench_llama_stages_runs_each_engine_then_trains_on_the_compiled_features(tmp_path, capsys):
    """The real extract stage with each hf engine and the train stage at batch 1 and 2, each a
    process of its own: the same tokens stored by both engines, the packed attention they ran
    (sdpa per sample in float32 on the CPU), the sglang engine skipped here with its reason, and
    train with params.yaml's compile auto running eager on the CPU, on hf-compiled's features
    (hf-eager's deleted)."""
    work = tmp_path / "work"
    args = ["--shape", "tiny", "--device", "cpu", "--engines", "hf-eager", "hf-compiled", "sglang"]
    args += ["--samples", "8", "--length", "64", "--train-batches", "1", "2", "--train-steps", "5"]
    args += ["--work", str(work), "--json-out", str(tmp_path / "stages.json")]
    results = bench_llama_stages.main(args)
    rows = printed_table(capsys.readouterr().out, "run")
    assert [(r["run"], r["stage tok/s"] == "skipped") for r in rows] == [
        ("extract hf-eager", False),
        ("extract hf-compiled", False),
        ("extract sglang", True),
        ("train batch 1", False),
        ("train batch 2", False),
    ]
    extract = results["extract"]
    assert extract["sglang"] == {"skipped": "the sglang engine needs a GPU"}
    assert results["tokens"] == (8 + 4) * 64  # the train and the eval split's samples
    for name in ("hf-eager", "hf-compiled"):
        e = extract[name]
        assert e["tokens_per_s"] > 0 and 0 < e["wall_tokens_per_s"] < e["tokens_per_s"]
        assert e["stored_tokens"] == e["extracted_tokens"] == e["tokens"] == results["tokens"]
        assert e["bytes_per_token"] == 512  # aux [2, 4, 5] and last: 4 x 64 x bf16
        assert e["attention"]["implementation"] == "eagle_pipeline_packed"
        assert set(e["attention"]["packed_kernels"]) == {"_per_sample"}
        assert e["peak_gib"] > 0
    assert extract["hf-compiled"]["warmup_s"] > 10 * extract["hf-eager"]["warmup_s"]  # compiles
    assert results["train_features"] == "hf-compiled"
    assert "features" not in extract["hf-eager"] and not (work / "hidden-hf-eager").exists()
    assert (work / "hidden-hf-compiled" / hidden.INDEX).exists()
    assert [t["batch_size"] for t in results["train"]] == [1, 2]
    for t in results["train"]:
        assert (t["compiled"], t["compile_failed_at_step"], t["steps"]) == (False, None, 5)
        assert t["tokens_per_s"] > 0 and t["warmup_s"] > 0 and t["padding_share"] == 0
        train = yaml.safe_load((work / f"train-b{t['batch_size']}.yaml").read_text())["train"]
        assert (train["compile"], train["fp8"], train["ttt_steps"]) == ("auto", False, 7)
        assert train["batch_size"] == t["batch_size"]
        assert not (work / f"train-b{t['batch_size']}" / "checkpoints").exists()
    assert json.loads((tmp_path / "stages.json").read_text()) == json.loads(json.dumps(results))


def test_bench_capture_noise_takes_the_difference_apart(capsys):
    """On the CPU the packed rows run each sample by itself: packing and reordering change
    nothing, and bf16 against fp32 grows with depth."""
    from tests.perf import bench_capture_noise

    result = bench_capture_noise.main(
        ["--shape", "tiny", "--samples", "3", "--lengths", "16", "32", "--device", "cpu"]
    )
    errors = result["errors"]
    assert errors["batch composition only: the floor"] == [0.0] * 4
    assert errors["packing (other samples in the row)"] == [0.0] * 4
    assert all(0 < e < 0.1 for e in errors["bf16 rounding (alone, sdpa)"])
    profile = result["bf16_vs_fp32_by_index"]
    assert profile[-1] > profile[1] > 0
    canary = result["canary"]
    assert len(canary["floor"]) == 4 and all(f >= 0 for f in canary["floor"])
    ratios = zip(canary["ratio"], canary["stage"], canary["floor"])
    assert all(r == e / f for r, e, f in ratios if f)
    out = capsys.readouterr().out
    assert "the floor" in out and "stage / floor" in out


@pytest.mark.slow
@pytest.mark.integration
def test_bench_demo_times_both_commits_and_compares_their_outputs(tmp_path, capsys):
    """This commit beside itself, as far as the check stage: both clones' repro, no-op reruns and
    two stages' start-ups are timed, and the outputs compare equal."""
    args = ["--base", "HEAD", "--until", "check", "--work", str(tmp_path)]
    args += ["--noop-repeat", "1", "--startup-repeat", "1", "--startup", "merge", "quality"]
    status = bench_demo.main(args)
    out = capsys.readouterr().out
    rows = {r["what"]: r for r in printed_table(out, "what")}
    assert status == 0 and "differing: none" in out
    assert set(rows) == {
        "dvc repro check",
        "no-op dvc repro (median)",
        "start-up stages.merge",
        "start-up stages.quality",
    }
    assert all(number(r["base s"]) > 0 and number(r["head s"]) > 0 for r in rows.values())
    assert (tmp_path / "head" / "reports" / "check.json").exists()


def test_the_server_decode_rate_is_read_from_its_log_within_a_run(tmp_path):
    """SGLang's own decode lines (0.5.17's words), the run's window in epoch seconds."""
    log = tmp_path / "server.log"
    lines = [
        ("19:06:54", 255, 165.58),  # the run's first line: it counts the idle time before it
        ("19:06:56", 255, 6838.46),
        ("19:06:57", 200, 5000.0),  # fewer running than the run holds in flight
        ("19:06:58", 255, 6938.76),
        ("19:06:59", 256, 7000.0),
        ("19:07:30", 256, 12000.0),  # after the run
    ]
    log.write_text(
        "[2026-12-05 19:06:50] Prefill batch, #new-seq: 28, #new-token: 8192\n"
        + "".join(
            f"[2026-12-05 {t}] Decode batch, #running-req: {n}, #token: 74545, token usage: "
            f"0.11, cuda graph: False, gen throughput (token/s): {rate}, #queue-req: 1\n"
            for t, n, rate in lines
        )
    )

    def at(clock: str) -> float:
        return time.mktime(time.strptime(f"2026-12-05 {clock}", "%Y-%m-%d %H:%M:%S"))

    window = (at("19:06:53"), at("19:07:00"))
    assert bench_client_vs_bare.server_decode_rate(log, window, 255) == 6938.8  # of 3, rounded
    assert bench_client_vs_bare.server_decode_rate(log, (at("19:08:00"), at("19:09:00")), 1) is None
    assert bench_client_vs_bare.server_decode_rate(tmp_path / "none.log", window, 1) is None


@pytest.mark.slow
def test_bench_client_vs_bare_sends_the_same_requests_both_ways(tmp_path, capsys):
    """Against the CPU stand-in server, both kinds: the bare runs and the stage get every reply,
    with the same ids where they are compared; then the estimate against the run."""
    prompts = tmp_path / "estimate-prompts"
    prompts.mkdir()
    for name, n in (("a", 4), ("b", 7)):
        bench_client_vs_bare.write_random_prompts(
            prompts / f"{name}.parquet", n, (4, 8), 200, dataset=name
        )
    out = tmp_path / "results.json"
    argv = ["--targets", "demo", "--concurrency", "3", "--requests-per-slot", "2", "--rounds", "2"]
    argv += ["--max-new-tokens", "6", "--prompt-lengths", "4", "8", "--server-flags"]
    argv += ["--module", "tests.doubles.hf_server", "--port", str(free_port())]
    argv += ["--work", str(tmp_path), "--json-out", str(out), "--estimate-prompts", str(prompts)]
    argv += ["--estimate-slots", "2"]
    assert bench_client_vs_bare.main(argv) == 0
    *rows, estimated = json.loads(out.read_text())
    assert [(r["server"], r["concurrency"], r["requests"], r.get("same_ids")) for r in rows] == [
        ("deterministic", 3, 6, True),
        ("ordinary", 3, 6, None),
    ]
    for r in rows:  # --rounds 2: bare, stage, bare, stage, bare
        assert len(r["bare_tokens_per_s"]) == 3 and len(r["stage_tokens_per_s"]) == 2
        assert all(rate > 0 for rate in r["bare_tokens_per_s"] + r["stage_tokens_per_s"])
        assert len(set(r["tokens"])) == 1 and r["tokens"][0] <= 6 * r["requests"]
        assert all(
            0 < loop < wall for loop, wall in zip(r["stage_loop_s"], r["stage_process_wall_s"])
        )
        assert r["server_decode_tokens_per_s"] == [None] * 5  # the stand-in logs no decode lines
        assert all(0 < held <= 3.05 for held in r["mean_in_flight"]), r["mean_in_flight"]
    assert [(r["dataset"], r["prompts"]) for r in estimated["datasets"]] == [("a", 4), ("b", 7)]
    assert all(r["projected_s"] > 0 and r["loop_s"] > 0 for r in estimated["datasets"])
    assert estimated["estimate"]["settings"]["slots"] == 2
    assert "stage/bare" in capsys.readouterr().out
    # the same method on the samples the estimate saved gives the seconds it gave then
    again = bench_estimate.reproject(tmp_path / "estimate" / "estimate.json", out)
    assert [r["dataset"] for r in again] == ["a", "b"]
    assert all(r["projected_s"] == r["projected_then_s"] > 0 for r in again), again


@pytest.mark.slow
@pytest.mark.shared(
    "models/stories260K",
    "data/sharegpt/ShareGPT_V3_filtered_500.json",
    "data/sharegpt/dummy_conversation.json",
)
def test_bench_fp8_acceptance_trains_and_benchmarks_each_arm_on_stories(tmp_path, capsys):
    """On the CPU the bf16 arm trains and benchmarks a real drafter of stories260K, and the fp8
    arm carries the stage's refusal: FP8 needs a GPU. DFlash's arms run its own stages on the
    same features."""
    from tests.perf import bench_fp8_acceptance

    work = ["--work", str(tmp_path)]
    bench_fp8_acceptance.main(["prepare", *work, "--samples", "6", "--new-tokens", "24"])
    params = yaml.safe_load((tmp_path / "project" / "params.yaml").read_text())
    assert params["target"]["path"] == "stories260K"  # relative: the folder travels
    assert params["train"]["draft"] == params["dflash"]["draft"] == {"intermediate_size": 176}
    out = tmp_path / "fp8.json"
    result = bench_fp8_acceptance.main(
        ["compare", *work, "--seeds", "0", "--json-out", str(out), "--timeout-s", "300"]
    )
    assert result["device"] == "cpu" and result["features"]["tokens"] > 0
    bf16, fp8 = result["runs"]["bf16-s0"], result["runs"]["fp8-s0"]
    assert bf16["tau_greedy"] >= 1 and bf16["best_replayed_tau"] >= 1, bf16
    assert bf16["compiled"] is False and bf16["steps"] > 0
    assert "FP8 products need a CUDA GPU" in fp8["error"]
    summary = result["summary"]
    assert (summary["bf16"]["runs"], summary["bf16"]["diverged"]) == (1, 0)
    assert summary["fp8"] == {"runs": 0, "diverged": 0}
    stopped = {"fp8-s1": {"error": "error: the loss is nan at step 9: training diverged. Lower"}}
    eagle3 = bench_fp8_acceptance.FAMILIES["eagle3"]
    assert bench_fp8_acceptance.summary(stopped, eagle3) == {"fp8": {"runs": 0, "diverged": 1}}
    assert summary["bf16"]["tau_greedy"]["mean"] == bf16["tau_greedy"]
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    printed = capsys.readouterr().out
    assert "bf16-s0 {" in printed and "fp8 {" in printed
    dflash = bench_fp8_acceptance.main(
        ["compare", *work, "--family", "dflash", "--seeds", "0", "--variants", "bf16", "eager"]
    )
    assert dflash["family"] == "dflash" and sorted(dflash["summary"]) == ["bf16", "eager"]
    for run in dflash["runs"].values():  # the CPU trains eager either way
        assert run["best_tau"] >= 1 and run["tau_greedy"] >= 1 and run["compiled"] is False, run
        assert "best_replayed_tau" not in run
    assert dflash["summary"]["eager"]["runs"] == 1
