"""benchmark: speculative decoding with the target and the EXPORTED drafter (loaded back from
models/drafter, which proves the export), against plain decoding of the same target.

Reads params `benchmark` and `target`. Held-out prompts: the eval split's prompts (already in the
serving chat template) per dataset, plus any prompt files under benchmark.datasets (MT-bench,
GSM8K, HumanEval...). Chain drafting, topk 1, at each temperature. Writes reports/benchmark.json
(tau, per-position acceptance conditional and unconditional, per dataset, wall-clock speedup of
this in-process loop) and reports/plots/benchmark_acceptance.csv.
"""
from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from . import config
from .cli import StageError, run
from .drafter.export import load_drafter
from .drafter.speculate import acceptance_stats, choose, speculative_generate
from .engines.hf import load_causal_lm
from .io import write_json, write_text
from .sources import prompt_messages, read_conversations
from .target import load_tokenizer, render_prompt, token_roles
from .train import csv_text


def eval_prompts(eval_file: Path, limit: int) -> dict[str, list[list[int]]]:
    prompts: dict[str, list[list[int]]] = {}
    for row in pq.read_table(eval_file, columns=["dataset", "input_ids", "loss_start"]).to_pylist():
        group = prompts.setdefault(row["dataset"], [])
        if len(group) < limit:
            group.append(row["input_ids"][: row["loss_start"]])
    return prompts


def file_prompts(source: config.BenchmarkSource, tokenizer, template_kwargs: dict,
                 limit: int) -> list[list[int]]:
    out = []
    for conv in read_conversations(source.path, source.format, columns=source.columns):
        out.append(render_prompt(tokenizer, prompt_messages(conv.messages), conv.tools,
                                 template_kwargs))
        if len(out) >= limit:
            break
    return out


@torch.no_grad()
def plain_decode(target, prompt: list[int], max_new_tokens: int, temperature: float,
                 stop_ids: set[int], generator: torch.Generator) -> list[int]:
    """One full target forward per token (no KV cache, as speculative_generate): the baseline."""
    device = next(target.parameters()).device
    ids = torch.tensor(prompt, device=device)
    out: list[int] = []
    while len(out) < max_new_tokens:
        logits = target(input_ids=ids[None], use_cache=False).logits[0]
        token = choose(logits[-1], temperature, generator)[0]
        out.append(token)
        ids = torch.cat([ids, ids.new_tensor([token])])
        if token in stop_ids:
            break
    return out


def benchmark(target, drafter, prompts: dict[str, list[list[int]]], b: config.BenchmarkParams,
              stop_ids: list[int]) -> dict:
    embed = target.get_input_embeddings()
    report: dict = {"num_steps": b.num_steps, "topk": 1, "mode": "chain",
                    "engine": "in-process transformers (no KV cache)", "temperatures": {}}
    for temperature in b.temperatures:
        per: dict = {}
        all_results = []
        for name, group in prompts.items():
            results, spec_s, base_s, identical = [], 0.0, 0.0, 0
            for i, prompt in enumerate(group):
                g = torch.Generator().manual_seed(b.seed + i)
                t0 = time.perf_counter()
                r = speculative_generate(target, drafter, embed, prompt, b.max_new_tokens,
                                         b.num_steps, temperature, stop_ids, g)
                t1 = time.perf_counter()
                base = plain_decode(target, prompt, b.max_new_tokens, temperature, set(stop_ids),
                                    torch.Generator().manual_seed(b.seed + i))
                t2 = time.perf_counter()
                spec_s, base_s = spec_s + t1 - t0, base_s + t2 - t1
                identical += base == r.output_ids
                results.append(r)
            stats = acceptance_stats(results)
            per[name] = {"prompts": len(group), "tau": round(stats.tau, 4),
                         "conditional": [round(x, 4) for x in stats.conditional],
                         "unconditional": [round(x, 4) for x in stats.unconditional],
                         "verify_steps": stats.verify_steps, "tokens": stats.tokens,
                         "baseline_tau": 1.0, "wall_speedup": round(base_s / spec_s, 3),
                         "outputs_equal_baseline": identical}
            all_results += results
        overall = acceptance_stats(all_results)
        report["temperatures"][str(temperature)] = {
            "tau": round(overall.tau, 4), "datasets": per,
            "conditional": [round(x, 4) for x in overall.conditional],
            "unconditional": [round(x, 4) for x in overall.unconditional]}
    greedy = report["temperatures"].get("0.0")
    report["tau_greedy"] = greedy and greedy["tau"]
    return report


def sglang_command(target_path: str, drafter_dir: Path, b: config.BenchmarkParams) -> str:
    """The SGLang launch this drafter is meant for (run on GPUs; EAGLE3, not EAGLE)."""
    return (f"python -m sglang.launch_server --model-path {target_path} "
            f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {drafter_dir} "
            f"--speculative-num-steps {b.num_steps} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {b.num_steps + 1}")


def main(params: Path = config.PARAMS_FILE, eval_file: Path = Path("data/merged/eval.parquet"),
         drafter_dir: Path = Path("models/drafter"), report_dir: Path = Path("reports")) -> None:
    """Measure acceptance length and speedup of the exported drafter."""
    b = config.section(config.BenchmarkParams, "benchmark", params)
    target = config.section(config.TargetParams, "target", params)
    tokenizer = load_tokenizer(target)
    stop_ids = token_roles(target, tokenizer).stop_ids
    prompts = eval_prompts(eval_file, b.max_prompts)
    for name, source in b.datasets.items():
        prompts[name] = file_prompts(source, tokenizer, target.template_kwargs, b.max_prompts)
    if not any(prompts.values()):
        raise StageError(f"{eval_file}: no held-out prompts; raise merge.eval_fraction or add "
                         f"benchmark.datasets")
    model = load_causal_lm(target.path, target.device, "float32" if target.dtype == "auto"
                           and not torch.cuda.is_available() else target.dtype,
                           target.trust_remote_code)
    drafter, _ = load_drafter(drafter_dir)
    drafter = drafter.to(next(model.parameters()).device).eval()
    report = benchmark(model, drafter, prompts, b, stop_ids)
    report["sglang_launch"] = sglang_command(target.path, drafter_dir, b)
    write_json(report, report_dir / "benchmark.json")
    write_text(csv_text([{"temperature": t, "dataset": d, "position": j + 1,
                          "conditional": v["conditional"][j], "unconditional": v["unconditional"][j]}
                         for t, tv in report["temperatures"].items()
                         for d, v in tv["datasets"].items() for j in range(b.num_steps)]),
               report_dir / "plots" / "benchmark_acceptance.csv")
    print(f"[benchmark] tau at T=0: {report['tau_greedy']}  "
          + "  ".join(f"{d}: {v['tau']}" for d, v in
                      report["temperatures"].get("0.0", {"datasets": {}})["datasets"].items()))


if __name__ == "__main__":
    run(main)
