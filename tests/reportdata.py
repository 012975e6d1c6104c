"""A small synthetic run's artifacts, as the report stage reads them: raw parts in the demo
target's real token ids (reasoning, answers, tool calls, a truncated and a failed turn), and the
reports, plots and exported config the other stages would have written. No model runs."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from stages.target.tokenizer import load_tokenizer, render_prompt
from stages.target.tokens import analyze_output, learn_roles
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
    "plots",
    "drafter-dir",
    "out",
    "metrics",
    "card",
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


def write_run(root: Path) -> dict[str, Path]:
    """Write the artifacts under `root` (and a params.yaml there); the report stage's options."""
    tok = load_tokenizer(DEMO_TARGET)
    paths = {
        "raw-dir": root / "data" / "raw",
        "generate-dir": root / "reports" / "generate",
        "merge-report": root / "reports" / "merge.json",
        "vocab-report": root / "reports" / "vocab.json",
        "extract-report": root / "reports" / "extract.json",
        "train-report": root / "reports" / "train.json",
        "benchmark-report": root / "reports" / "benchmark.json",
        "plots": root / "reports" / "plots",
        "drafter-dir": root / "models" / "drafter",
        "out": root / "reports" / "index.html",
        "metrics": root / "reports" / "metrics.json",
        "card": root / "models" / "card" / "README.md",
    }
    for name, (_, tools) in DATASETS.items():
        rows = _rows(tok, name, tools)
        write_raw(paths["raw-dir"] / name, rows)
        _json(
            paths["generate-dir"] / f"{name}.json",
            {
                "dataset": name,
                "samples": len(rows),
                "tokens": sum(r["completion_tokens"] for r in rows),
                "failed": 1,
                "tokens_per_s": 100.0,
            },
        )
    per = {
        n: {"samples": 6, "tokens": 900 + i, "supervised_tokens": 400 + i, "turns": 6}
        for i, n in enumerate(DATASETS)
    }
    _json(
        paths["merge-report"],
        {
            "summary": {"train": {"samples": 12, "tokens": 1801, "supervised_tokens": 801}},
            "per_dataset": {"train": per},
        },
    )
    _json(
        paths["vocab-report"],
        {"draft_vocab_size": 1024, "target_vocab_size": 2048, "coverage": 0.99},
    )
    _json(
        paths["extract-report"],
        {"tokens": 2000, "aux_hf_indices": [2, 4, 5], "tokens_per_s": 4000.0},
    )
    _json(
        paths["train-report"],
        {
            "steps": 20,
            "final_loss": 2.5,
            "best_step": 20,
            "best_replayed_tau": 2.4,
            "best_simulated_tau": 2.9,
            "eval_num_steps": 3,
            "world_size": 1,
            "tokens_per_s": 1000.0,
        },
    )
    per_temp = {
        "0.0": {"chat": 2.5, "tools": 3.1, "all": 2.7},
        "0.7": {"chat": 2.0, "tools": 2.6, "all": 2.2},
    }
    _json(
        paths["benchmark-report"],
        {
            "num_steps": 3,
            "topk": 1,
            "mode": "chain",
            "engine": "in-process transformers (KV cache)",
            "temperatures": {
                t: {
                    "tau": v["all"],
                    "conditional": [0.7, 0.8, 0.85],
                    "unconditional": [0.7, 0.56, 0.48],
                    "datasets": {
                        d: {
                            "prompts": 2,
                            "tau": v[d],
                            # a position no chain reached: null (NaN written as null)
                            "conditional": [0.7, 0.8, None if t == "0.7" else 0.85],
                            "unconditional": [0.7, 0.56, 0.48],
                            "baseline_tau": 1.0,
                            "outputs_equal_baseline": 2,
                        }
                        for d in DATASETS
                    },
                }
                for t, v in per_temp.items()
            },
            "tau_greedy": 2.7,
            "sglang_launch": "python -m sglang.launch_server ...",
        },
    )
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


def _json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1))
