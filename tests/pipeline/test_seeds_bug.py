"""The original run's bug, injected: an engine that loses the reasoning tokens (as the
OpenAI-compatible endpoint does without a reasoning parser). The quality gate must stop the run,
naming the dataset and the number; the same run with the raw ids passes."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from stages import quality
from stages.engines import Completion
from stages.engines.hf import HFEngine
from stages.generate import generate_dataset
from stages.params.generate import GenerateParams
from stages.params.target import TargetParams
from stages.target_model.model import load_causal_lm
from stages.target_model.tokenizer import pad_id, render_prompt
from stages.wiring.target import target_roles, target_tokenizer
from tests.stage_runner import run_stage

pytestmark = pytest.mark.slow  # 512-token generations of the demo target, twice

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain how a hash map works.",
    "What is the capital of France?",
    "Write a program that prints the first ten primes.",
]


class LosesReasoning:
    """Returns only what follows the first end-of-reasoning token: the answer without reasoning."""

    name = "lossy"

    def __init__(self, inner, end_think: int):
        self.inner, self.end_think = inner, end_think

    def generate(self, requests, sampling):
        for done in self.inner.generate(requests, sampling):
            ids = done.output_ids
            cut = ids.index(self.end_think) + 1 if self.end_think in ids else 0
            yield Completion(done.sample_id, ids[cut:], done.finish_reason, done.latency_s)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, demo_target):
    tmp = tmp_path_factory.mktemp("seeds")
    target = TargetParams(path=str(demo_target))
    tok = target_tokenizer(target)
    roles = target_roles(target, tok)
    rows = []
    for i, text in enumerate(PROMPTS):
        messages = [{"role": "user", "content": text}]
        ids = render_prompt(tok, messages, None, {})
        rows.append(
            dict(
                sample_id=f"chat/{i}",
                dataset="chat",
                messages=json.dumps(messages),
                tools=None,
                prompt_ids=ids,
                prompt_len=len(ids),
                reasoning_open=ids[-1] == roles.think,
            )
        )
    pq.write_table(pa.Table.from_pylist(rows), tmp / "chat.parquet")
    engine = HFEngine(load_causal_lm(str(demo_target)), pad_id(tok), batch_size=4)
    params = tmp / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {
                "datasets": {
                    "chat": {
                        "prep": {"format": "sharegpt", "path": "unused"},
                        "expect": {"reasoning": True},
                    }
                },
                "quality": {"max_truncated": 1.0},
            }
        )
    )
    return tmp, target, engine, roles, params


@pytest.mark.parametrize("lossy", [False, True])
def test_gate_stops_lost_reasoning(setup, lossy, monkeypatch, capsys):
    tmp, target, engine, roles, params = setup
    run = tmp / ("lossy" if lossy else "raw")
    gen = GenerateParams(max_new_tokens=512, batch_size=4)
    used = LosesReasoning(engine, roles.end_think) if lossy else engine
    generate_dataset("chat", tmp / "chat.parquet", run / "raw" / "chat", gen, 10**6, target, used)
    reports = run / "reports"
    code, out, err = run_stage(
        quality.main,
        [
            "--params",
            params,
            "--raw-dir",
            run / "raw",
            "--prep-dir",
            run / "prep",
            "--report",
            reports / "quality.json",
            "--summary",
            reports / "quality.md",
            "--plot",
            reports / "plots" / "lengths.csv",
        ],
        monkeypatch,
        capsys,
    )
    if lossy:
        assert code == 1
        assert (
            "dataset chat: reasoning closed in 0.0% (minimum 90%, quality.min_reasoning_closed)"
        ) in err
    else:
        assert code == 0, err
        assert json.loads((run / "reports" / "quality.json").read_text())["gate_passed"]
