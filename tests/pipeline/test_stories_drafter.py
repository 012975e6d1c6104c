"""The whole pipeline (dvc repro, prep -> benchmark) pointed by params at a real pretrained model:
stories260K, with a chat template supplied through params since it ships none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SHARED, STORIES, STORIES_REL
from tests.project import copy_project, ran_stages, sh

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.shared(STORIES_REL, "data/sharegpt/dummy_conversation.json"),
]
TEMPLATE = Path(__file__).parents[1] / "fixtures" / "stories_chat_template.jinja"


def stories_params(p: dict) -> None:
    p["target"].update(path=str(STORIES), chat_template=str(TEMPLATE))
    p["datasets"] = {
        "sharegpt": {
            "prep": {
                "format": "sharegpt",
                "path": str(SHARED / "data/sharegpt/dummy_conversation.json"),
                "max_samples": 160,
                "max_prompt_tokens": 64,
            },
            "generate": {"budget_tokens": 10**6},
            "expect": {"reasoning": False},
        }
    }  # a base model: no reasoning tokens
    p["generate"].update(max_new_tokens=96, batch_size=32)
    p["merge"].update(eval_fraction=0.1)
    p["quality"].update(max_truncated=1.0)  # stories run past 96 tokens: truncation expected
    p["vocab"]["draft_vocab_size"] = 256
    p["extract"]["layers"] = [1, 2, 3]  # 5 layers: the default [2, N//2, N-3] would repeat 2
    p["train"].update(
        epochs=8, batch_size=8, lr=3e-3, ttt_steps=4, eval_every=50, checkpoint_every=50
    )
    p["benchmark"].update(max_prompts=8, max_new_tokens=96, temperatures=[0.0])


def test_stories_drafter_accepts(tmp_path):
    assert STORIES.exists(), f"{STORIES} is missing: tests need ../shared beside the project"
    repo = copy_project(tmp_path / "project", stories_params)
    out = sh(["dvc", "repro", "benchmark"], repo)
    assert {"prep@sharegpt", "generate@sharegpt", "extract", "train", "benchmark"} <= ran_stages(
        out.stdout
    )
    report = json.loads((repo / "reports" / "benchmark.json").read_text())
    greedy = report["temperatures"]["0.0"]["datasets"]["sharegpt"]
    assert greedy["outputs_equal_baseline"] == greedy["prompts"]  # lossless at temperature 0
    assert report["tau_greedy"] > 1.8, report
    assert json.loads((repo / "models/drafter/config.json").read_text())["architectures"] == [
        "LlamaForCausalLMEagle3"
    ]
