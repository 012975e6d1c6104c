"""A small synthetic run's artifacts, as the report stage reads them: raw parts in the demo
target's real token ids (reasoning, answers, tool calls, a truncated and a failed turn), and the
reports (each written through its record, stages/reports/), plots and exported config the other
stages would have written; its extraction had every shard on disk already, so one figure of the
metrics is null. No model runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import yaml

from stages.reports.benchmark import (
    DFlashInProcessBenchmark,
    InProcessBenchmark,
    InProcessFigures,
    InProcessTemperature,
    NotTrained,
)
from stages.reports.extract import DrafterLayers, ExtractReport
from stages.reports.generate import GenerateReport
from stages.reports.merge import MergeCounts, MergeReport, SplitsByDataset, SplitTotals
from stages.reports.train import TrainReport
from stages.reports.vocab import VocabReport
from stages.target_model.tokenizer import load_tokenizer, render_prompt
from stages.target_model.tokens import analyze_output, learn_roles
from stages.wiring.drafter_run import STORED
from tests.conftest import DEMO_TARGET, ROOT
from tests.rawdata import raw_row, write_raw

DATASETS = {"chat": (True, False), "tools": (True, True)}  # name -> (reasoning, tool calls)
ERROR = "HTTP 500 from http://127.0.0.1:30000/generate: CUDA out of memory"
REPORT_ARGS = (
    "raw-dir",
    "generate-dir",
    "merge-report",
    "vocab-report",
    "extract-report",
    "train-report",
    "benchmark-report",
    "dflash-report",
    "plots",
    "drafter-dir",
    "dflash-dir",
    "out",
    "metrics",
    "metrics-notes",
    "card",
)


def generate_report(dataset: str, samples: int, tokens: int) -> GenerateReport:
    """A dataset generated in one run, one abort among its turns."""
    return GenerateReport(
        dataset=dataset,
        samples=samples,
        prompts=samples,
        new_samples=samples,
        turns=samples,
        new_turns=samples,
        stopped_at_prompt_limit=0,
        tokens=tokens,
        budget_tokens=5000,
        budget_overshoot_tokens=0,
        budget_reached=False,
        failed=1,
        tokens_per_s=100.0,
        engine="hf",
        fingerprint="0123456789abcdef",
    )


def merge_counts(samples: int, tokens: int, supervised_tokens: int) -> MergeCounts:
    return MergeCounts(samples, samples, 0, tokens, supervised_tokens, samples, 0, 0)


_PER_DATASET = {n: merge_counts(6, 900 + i, 400 + i) for i, n in enumerate(DATASETS)}
MERGE = MergeReport(
    summary=SplitTotals(train=MergeCounts.total(_PER_DATASET.values()), eval=MergeCounts.total([])),
    per_dataset=SplitsByDataset(train=_PER_DATASET, eval={}),
)
VOCAB = VocabReport(
    draft_vocab_size=1024,
    target_vocab_size=2048,
    distinct_supervised_tokens=900,
    supervised_tokens=801,
    coverage=0.99,
)
EXTRACT = ExtractReport(
    tokens=2000,
    shards=1,
    samples=12,
    store="all",
    bytes=2000 * 1024,
    bytes_per_token=1024,
    bytes_per_token_all=1024,
    aux_hf_indices=[2, 4, 5],
    world_size=1,
    engine="hf",
    extracted_tokens=2000,
    tokens_per_s=4000.0,
    warmup_s=0.2,
    time={"loop_s": 0.5, "forward_s": 0.4},
    drafters={
        "eagle3": DrafterLayers([2, 4, 5], [2, 4], 512, 28672),
        "dflash": DrafterLayers([5], [], 0, 0),
    },
)
EXTRACT_RESUMED = replace(EXTRACT, extracted_tokens=0, tokens_per_s=0.0)  # every shard on disk
TRAIN = TrainReport(
    steps=20,
    final_loss=2.5,
    best_step=20,
    best_replayed_tau=2.4,
    best_simulated_tau=2.9,
    eval_num_steps=3,
    world_size=1,
    tokens_per_s=1000.0,
    warmup_s=1.5,
    padding_share=0.05,
    compiled=False,
    compile_failed_at_step=None,
    features=STORED,
    target_forward_share=None,
)


def _figures(prompts: int, tau: float, last_conditional: float | None) -> InProcessFigures:
    return InProcessFigures(
        prompts=prompts,
        tau=tau,
        conditional=[0.7, 0.8, last_conditional],
        unconditional=[0.7, 0.56, 0.48],
        verify_steps=20 * prompts,
        outputs_equal_baseline=prompts,
        tokens=round(20 * prompts * tau),
        baseline_tau=1.0,
        wall_speedup=1.2,
    )


def benchmark_report(
    taus: dict[float, dict[str, float]], record: type[InProcessBenchmark] = InProcessBenchmark
) -> InProcessBenchmark:
    """Per temperature, each dataset's tau and "all"'s; at 0.7 no chain reached the third draft
    (NaN, written as null). `record`: EAGLE-3's chain of 3, or DFlash's block of 4."""
    temperatures = {
        t: InProcessTemperature(
            **vars(_figures(2 * len(DATASETS), v["all"], 0.85)),
            datasets={d: _figures(2, v[d], float("nan") if t else 0.85) for d in DATASETS},
        )
        for t, v in taus.items()
    }
    dflash = record is DFlashInProcessBenchmark
    return record(
        drafter="DFlash" if dflash else "EAGLE-3",
        num_steps=3,
        tokens_verified_per_step=4,
        topk=1,
        mode="block" if dflash else "chain",
        engine="in-process transformers (KV cache)",
        temperatures=temperatures,
        tau_greedy=taus[0.0]["all"],
        sglang_launch="python -m sglang.launch_server ...",
    )


BENCHMARK = benchmark_report(
    {0.0: {"chat": 2.5, "tools": 3.1, "all": 2.7}, 0.7: {"chat": 2.0, "tools": 2.6, "all": 2.2}}
)
DFLASH = benchmark_report(
    {0.0: {"chat": 1.8, "tools": 2.3, "all": 2.05}, 0.7: {"chat": 1.5, "tools": 1.9, "all": 1.7}},
    DFlashInProcessBenchmark,
)
# benchmark_dflash's report when extract.drafters leaves out dflash (stages/benchmark_dflash.py)
DFLASH_NOT_TRAINED = NotTrained(
    drafter="DFlash",
    trained=False,
    reason="extract.drafters leaves out dflash, so train_dflash left models/dflash empty",
)


def _reply(tok, reasoning: str | None, answer: str, call: str | None, stop: bool) -> list[int]:
    ids: list[int] = []
    if reasoning is not None:
        ids += tok.encode(reasoning, add_special_tokens=False) + [
            tok.convert_tokens_to_ids("</think>")
        ]
    ids += tok.encode(answer, add_special_tokens=False)
    if call:
        t = tok.convert_tokens_to_ids
        ids += [t("<|tool_calls_section_begin|>"), t("<|tool_call_begin|>")]
        ids += tok.encode("functions.get_weather:0", add_special_tokens=False)
        ids += [t("<|tool_call_argument_begin|>")] + tok.encode(call, add_special_tokens=False)
        ids += [t("<|tool_call_end|>"), t("<|tool_calls_section_end|>")]
    if stop:
        ids.append(tok.convert_tokens_to_ids("<|im_end|>"))
    return ids


def _rows(tok, dataset: str, tools: bool) -> list[dict]:
    roles = learn_roles(tok)
    rows = []
    for n in range(8):
        question = f"{dataset} question {n}: what is {n} plus {n}? " + "Tell me more. " * n
        prompt = render_prompt(tok, [{"role": "user", "content": question}], None, {})
        finish = "length" if n == 6 else "abort" if n == 7 else "stop"
        call = '{"city": "Paris"}' if tools and n % 2 == 0 else None
        out = _reply(tok, f"The user asks {n} plus {n}. " * (n + 1), f"It is {2 * n}.", call, True)
        if finish == "length":
            out = tok.encode("I am still thinking about this " * 5, add_special_tokens=False)
        elif finish == "abort":
            out = []
        anatomy = analyze_output(out, roles, reasoning_open=True)
        row = raw_row(dataset, n, prompt=question, finish=finish, tools=tools)
        row.update(
            prompt_ids=prompt,
            prompt_len=len(prompt),
            output_ids=out,
            completion_tokens=len(out),
            reasoning_tokens=anatomy.reasoning_tokens,
            answer_tokens=anatomy.answer_tokens,
            tool_calls=anatomy.tool_calls,
            tool_calls_balanced=anatomy.tool_calls_balanced,
            error=ERROR if finish == "abort" else None,
            output_text=tok.decode(out),
        )
        rows.append(row)
    return rows


def write_run(root: Path, dflash: InProcessBenchmark | NotTrained = DFLASH) -> dict[str, Path]:
    """Write the artifacts under `root` (and a params.yaml there); the report stage's options.
    `dflash`: the DFlash benchmark's report (DFLASH_NOT_TRAINED: no DFlash drafter trained)."""
    tok = load_tokenizer(DEMO_TARGET)
    paths = {
        "raw-dir": root / "data" / "raw",
        "generate-dir": root / "reports" / "generate",
        "merge-report": root / "reports" / "merge.json",
        "vocab-report": root / "reports" / "vocab.json",
        "extract-report": root / "reports" / "extract.json",
        "train-report": root / "reports" / "train.json",
        "benchmark-report": root / "reports" / "benchmark.json",
        "dflash-report": root / "reports" / "benchmark_dflash.json",
        "plots": root / "reports" / "plots",
        "drafter-dir": root / "models" / "drafter",
        "dflash-dir": root / "models" / "dflash",
        "out": root / "reports" / "index.html",
        "metrics": root / "reports" / "metrics.json",
        "metrics-notes": root / "reports" / "metrics_notes.json",
        "card": root / "models" / "card" / "README.md",
    }
    for name, (_, tools) in DATASETS.items():
        rows = _rows(tok, name, tools)
        write_raw(paths["raw-dir"] / name, rows)
        tokens = sum(r["completion_tokens"] for r in rows)
        generate_report(name, len(rows), tokens).write(paths["generate-dir"] / f"{name}.json")
    MERGE.write(paths["merge-report"])
    VOCAB.write(paths["vocab-report"])
    EXTRACT_RESUMED.write(paths["extract-report"])
    TRAIN.write(paths["train-report"])
    BENCHMARK.write(paths["benchmark-report"])
    dflash.write(paths["dflash-report"])
    plots = paths["plots"]
    plots.mkdir(parents=True, exist_ok=True)
    (plots / "train_loss.csv").write_text(
        "step,loss,lr,grad_norm,acc_0\n"
        + "".join(f"{s},{8 / s:.4f},0.001,1.0,{min(s / 20, 0.9):.3f}\n" for s in range(1, 21))
    )
    (plots / "train_evals.csv").write_text(
        "step,replayed_tau,simulated_tau\n10,1.9,2.3\n20,2.4,2.9\n"
    )
    (plots / "train_acceptance.csv").write_text(
        "position,accuracy,conditional,unconditional\n1,0.7,0.7,0.7\n2,0.6,0.8,0.56\n"
        "3,0.5,0.85,0.48\n"
    )
    _json(
        paths["drafter-dir"] / "config.json",
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
            "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
        },
    )
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["target"]["path"] = str(DEMO_TARGET)
    params["datasets"] = {
        n: {
            "prep": {"format": "sharegpt", "path": "unused.json"},
            "generate": {"budget_tokens": 5000},
            "expect": {"reasoning": r, "tool_calls": t},
        }
        for n, (r, t) in DATASETS.items()
    }
    params["report"]["card"]["base_model"] = "example-org/demo-target"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return paths


def report_args(paths: dict[str, Path], root: Path) -> list[str]:
    args = [f"--{k}={paths[k]}" for k in REPORT_ARGS]
    return [*args, f"--params={root / 'params.yaml'}"]


def _json(path: Path, obj: dict) -> None:  # the exported drafter's config.json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))
