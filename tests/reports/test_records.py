"""Each report's record (stages/reports/): what its stage writes, the report stage reads back field
for field; a file whose keys or values are not its record's is refused, naming the file, the key
and the stage to rerun; and a writer cannot write a report its readers would refuse."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stages.reports.benchmark import (
    DFlashInProcessBenchmark,
    InProcessBenchmark,
    NotTrained,
    ServedBenchmark,
    ServedFigures,
    ServedTemperature,
    read_benchmark,
    read_dflash_benchmark,
)
from stages.reports.check import CheckReport
from stages.reports.metrics import MetricsNotes, RunMetrics
from stages.reports.prep import PrepReport
from stages.reports.quality import DatasetQuality, QualityReport
from stages.reports.record import Mismatch, Report, ReportError
from tests.project import ROOT
from tests.reportdata import (
    BENCHMARK,
    DFLASH,
    DFLASH_NOT_TRAINED,
    EXTRACT,
    MERGE,
    TRAIN,
    VOCAB,
    generate_report,
)

sys.path.insert(0, str(ROOT / "tools"))
import structure  # noqa: E402

SERVED_FIGURES = ServedFigures(
    prompts=2,
    tau=3.1,
    conditional=None,  # a server that reports no per-draft histogram
    unconditional=None,
    verify_steps=10,
    outputs_equal_baseline=2,
    tau_excluding_prefill=2.9,
    completion_tokens=31,
    spec_tokens_per_s=310.0,
    base_tokens_per_s=120.0,
    speedup=2.583,
    spec_mean_latency_s=0.1,
    base_mean_latency_s=0.26,
)
SERVED = ServedBenchmark(
    drafter="EAGLE-3",
    num_steps=3,
    tokens_verified_per_step=4,
    topk=1,
    mode="chain",
    engine="sglang",
    engine_version="0.5.17",
    concurrency=8,
    tau_convention="completion_tokens / spec_verify_ct",
    servers={"spec": {"url": "http://127.0.0.1:30000", "launched": False}},
    temperatures={
        0.0: ServedTemperature(**vars(SERVED_FIGURES), datasets={"chat": SERVED_FIGURES})
    },
    tau_greedy=3.1,
)
METRICS = RunMetrics(
    generated_samples=16,
    generated_tokens=679,
    train_supervised_tokens=801,
    reasoning_closed_min_share=0.857,
    truncated_max_share=0.125,
    tool_call_min_share=None,
    vocab_coverage_share=0.99,
    replayed_tau_best_tokens_per_step=2.4,
    benchmark_tau_t0_tokens_per_step=2.7,
    dflash_tau_t0_tokens_per_step=2.05,
    extract_tokens_per_s=4000.0,
    train_tokens_per_s=None,
)
NOTES = MetricsNotes.of(
    METRICS,
    {
        "tool_call_min_share": "not measured: no dataset expects tool calls",
        "train_tokens_per_s": "not measured: this run took no step after its warm-up steps",
    },
)
RECORDS: dict[str, Report] = {
    "check": CheckReport(),
    "prep": PrepReport("chat", 25, 1, 3, 2, 0, 19, 19, ["row 7: no messages"]),
    "generate": generate_report("chat", 8, 400),
    "merge": MERGE,
    "quality": QualityReport(
        gate_passed=True, datasets={"chat": DatasetQuality(rows=25, stop_share=1.0, prompt_p50=40)}
    ),
    "vocab": VOCAB,
    "extract": EXTRACT,
    "train": TRAIN,
    "benchmark": BENCHMARK,
    "benchmark (sglang)": SERVED,
    "benchmark_dflash": DFLASH,
    "benchmark_dflash (not trained)": DFLASH_NOT_TRAINED,
    "metrics": METRICS,
    "metrics notes": NOTES,
}
# The keys of each file: what `make demo`, `dvc metrics`, people and other tools read. Renaming a
# record's field renames a key of its file, so it fails here until the change is meant.
KEYS = {
    "check": ["params"],
    "prep": [
        "dataset",
        "rows",
        "malformed",
        "duplicate",
        "too_long",
        "sampled_out",
        "kept",
        "turns",
        "malformed_examples",
    ],
    "generate": [
        "dataset",
        "samples",
        "prompts",
        "new_samples",
        "turns",
        "new_turns",
        "stopped_at_prompt_limit",
        "tokens",
        "budget_tokens",
        "budget_overshoot_tokens",
        "budget_reached",
        "failed",
        "tokens_per_s",
        "engine",
        "fingerprint",
    ],
    "merge": ["summary", "per_dataset"],
    "quality": ["gate_passed", "datasets"],
    "vocab": [
        "draft_vocab_size",
        "target_vocab_size",
        "distinct_supervised_tokens",
        "supervised_tokens",
        "coverage",
    ],
    "extract": [
        "tokens",
        "shards",
        "samples",
        "store",
        "bytes",
        "bytes_per_token",
        "bytes_per_token_all",
        "aux_hf_indices",
        "world_size",
        "engine",
        "extracted_tokens",
        "tokens_per_s",
        "warmup_s",
        "time",
        "drafters",
    ],
    "train": [
        "world_size",
        "tokens_per_s",
        "warmup_s",
        "padding_share",
        "compiled",
        "compile_failed_at_step",
        "features",
        "target_forward_share",
        "steps",
        "final_loss",
        "best_step",
        "best_replayed_tau",
        "best_simulated_tau",
        "eval_num_steps",
    ],
    "benchmark": [
        "drafter",
        "num_steps",
        "tokens_verified_per_step",
        "topk",
        "mode",
        "engine",
        "temperatures",
        "tau_greedy",
        "sglang_launch",
    ],
    "benchmark (sglang)": [
        "drafter",
        "num_steps",
        "tokens_verified_per_step",
        "topk",
        "mode",
        "engine",
        "engine_version",
        "concurrency",
        "tau_convention",
        "servers",
        "temperatures",
        "tau_greedy",
    ],
    "metrics": [
        "generated_samples",
        "generated_tokens",
        "train_supervised_tokens",
        "reasoning_closed_min_share",
        "truncated_max_share",
        "tool_call_min_share",
        "vocab_coverage_share",
        "replayed_tau_best_tokens_per_step",
        "benchmark_tau_t0_tokens_per_step",
        "dflash_tau_t0_tokens_per_step",
        "extract_tokens_per_s",
        "train_tokens_per_s",
    ],
    "metrics notes": ["why_null"],
    "benchmark_dflash (not trained)": ["drafter", "trained", "reason"],
}
KEYS["benchmark_dflash"] = KEYS["benchmark"]  # the same record, written by the DFlash stage


def read_back(record: Report, path: Path) -> Report:
    """As the report stage reads the file (the benchmarks' by their engine)."""
    if isinstance(record, (DFlashInProcessBenchmark, NotTrained)):
        return read_dflash_benchmark(path)
    if isinstance(record, (InProcessBenchmark, ServedBenchmark)):
        return read_benchmark(path)
    return type(record).read(path)


def written(record: Report, tmp_path: Path) -> tuple[Path, dict]:
    path = tmp_path / "reports" / "some.json"
    record.write(path)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("name", RECORDS)
def test_a_report_reads_back_as_its_stage_wrote_it(tmp_path, name):
    record = RECORDS[name]
    path, data = written(record, tmp_path)
    assert list(data) == KEYS[name]
    back = read_back(record, path)
    assert type(back) is type(record) and back.to_json() == data


def test_the_benchmark_keys_temperatures_as_before_and_nan_as_null(tmp_path):
    path, data = written(BENCHMARK, tmp_path)
    assert list(data["temperatures"]) == ["0.0", "0.7"]
    assert data["temperatures"]["0.7"]["datasets"]["chat"]["conditional"] == [0.7, 0.8, None]
    assert read_benchmark(path).temperatures[0.7].datasets["chat"].conditional == [0.7, 0.8, None]


@pytest.mark.parametrize("name", RECORDS)
def test_a_renamed_key_is_refused_naming_the_file_and_the_key(tmp_path, name):
    record = RECORDS[name]
    path, data = written(record, tmp_path)
    key = KEYS[name][0]
    path.write_text(json.dumps({(f"{k}_was" if k == key else k): v for k, v in data.items()}))
    with pytest.raises(ReportError) as refused:
        read_back(record, path)
    message = str(refused.value)
    assert message.startswith(f"{path}: ")
    assert f'key "{key}" is missing (the file has "{key}_was" instead)' in message
    assert f"dvc repro {record.STAGE}" in message


@pytest.mark.parametrize("name", RECORDS)
def test_an_unknown_key_is_refused(tmp_path, name):
    record = RECORDS[name]
    path, data = written(record, tmp_path)
    path.write_text(json.dumps({**data, "new_figure": 1}))
    with pytest.raises(ReportError, match=r'unknown key "new_figure"'):
        read_back(record, path)


def test_a_nested_key_and_a_value_of_another_type_are_named_where_they_are(tmp_path):
    path, data = written(BENCHMARK, tmp_path)
    del data["temperatures"]["0.7"]["datasets"]["tools"]["tau"]
    path.write_text(json.dumps(data))
    with pytest.raises(ReportError, match=r'temperatures\["0.7"\].datasets\["tools"\]: key "tau"'):
        read_benchmark(path)
    path, data = written(TRAIN, tmp_path)
    path.write_text(json.dumps({**data, "steps": "20"}))
    with pytest.raises(ReportError, match=r'some.json: steps: "20" where a whole number belongs'):
        TRAIN.read(path)
    path, data = written(BENCHMARK, tmp_path)
    path.write_text(json.dumps({**data, "engine": "vllm"}))
    with pytest.raises(ReportError, match=r'engine: "vllm" is neither .* nor \'sglang\''):
        read_benchmark(path)


def test_the_dflash_report_reads_as_not_trained_only_where_it_says_so(tmp_path):
    """read_dflash_benchmark: NotTrained for a file with `trained`, the figures for any other;
    a `trained: true` is no report either stage writes."""
    path, data = written(DFLASH_NOT_TRAINED, tmp_path)
    assert data == {"drafter": "DFlash", "trained": False, "reason": DFLASH_NOT_TRAINED.reason}
    assert read_dflash_benchmark(path) == DFLASH_NOT_TRAINED
    path.write_text(json.dumps({**data, "trained": True}))
    with pytest.raises(ReportError, match=r"trained: true where false belongs.*benchmark_dflash"):
        read_dflash_benchmark(path)
    path, _ = written(DFLASH, tmp_path)
    assert isinstance(read_dflash_benchmark(path), DFlashInProcessBenchmark)


def test_a_missing_report_names_the_stage_to_run(tmp_path):
    with pytest.raises(ReportError, match=r"does not exist; run the train stage \(dvc repro"):
        TRAIN.read(tmp_path / "train.json")


def test_a_writer_cannot_write_what_its_readers_refuse(tmp_path):
    path = tmp_path / "train.json"
    with pytest.raises(ReportError, match=r"train stage built a report .*steps: \"20\""):
        replace(TRAIN, steps="20").write(path)  # type: ignore[arg-type]
    with pytest.raises(ReportError, match=r"padding_share: null where a number belongs"):
        replace(TRAIN, padding_share=float("nan")).write(path)  # NaN is written as null
    assert not path.exists()


def test_a_null_metric_without_its_reason_cannot_be_made():
    with pytest.raises(Mismatch, match='figure "train_tokens_per_s" is null'):
        MetricsNotes.of(METRICS, {"tool_call_min_share": "no dataset expects tool calls"})
    with pytest.raises(Mismatch, match='a reason for "generated_samples", which is not null'):
        MetricsNotes.of(METRICS, {**NOTES.why_null, "generated_samples": "?"})


# The report modules each stage runs (besides the package and record.py): its own, and the
# report stage those it reads, so that editing one report's record reruns only those stages.
REPORT_MODULES = {
    "check": {"check"},
    "prep": {"prep"},
    "generate": {"generate"},
    "merge": {"merge"},
    "quality": {"prep", "quality"},  # it reads the prep reports
    "vocab": {"vocab"},
    "extract": {"extract"},
    "train": {"train", "training"},  # training: what both training reports keep
    "train_dflash": {"train_dflash", "training"},
    "benchmark": {"benchmark"},
    "benchmark_dflash": {"benchmark"},  # the same records, under its stage's name
    "report": {"benchmark", "extract", "generate", "merge", "metrics", "train", "training", "vocab"},
}


@pytest.mark.slow
def test_each_stage_runs_the_record_of_its_own_report_and_no_other():
    stages = structure.stage_modules(ROOT)
    assert set(stages) == set(REPORT_MODULES)
    for name, (module, _) in stages.items():
        runs = {f for f in structure.needed_files(ROOT, module) if f.startswith("stages/reports/")}
        shared = {"stages/reports/__init__.py", "stages/reports/record.py"}
        assert runs == shared | {f"stages/reports/{m}.py" for m in REPORT_MODULES[name]}, name
