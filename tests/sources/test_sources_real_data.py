"""The adapters on the real public sample files in ../shared/data (read in place)."""

import json

import pytest

from stages.sources import prompt_messages, read_conversations
from tests.conftest import SHARED

DATA = SHARED / "data"
pytestmark = pytest.mark.shared("data")


def read_all(relative, format):
    bad = []
    conversations = list(read_conversations(DATA / relative, format, on_bad_row=bad.append))
    assert bad == []
    return conversations


def test_sharegpt_first_turn_prompts():
    conversations = read_all("sharegpt/ShareGPT_V3_filtered_500.json", "sharegpt")
    assert len(conversations) == 500
    assert len({c.source_id for c in conversations}) == 500
    assert conversations[0].source_id == "fzcoUcK_0"
    assert all([m["role"] for m in c.messages] == ["user"] for c in conversations)
    assert conversations[0].messages[0]["content"].startswith("How to stop automatic updates")


def test_sharegpt_multi_turn_conversations():
    conversations = read_all("sharegpt/dummy_conversation.json", "sharegpt")
    source = json.loads((DATA / "sharegpt/dummy_conversation.json").read_text())
    assert [c.source_id for c in conversations] == [r["id"] for r in source]
    for conversation, row in zip(conversations, source):
        assert [m["content"] for m in conversation.messages] == [
            t["value"] for t in row["conversations"]
        ]
        roles = [m["role"] for m in conversation.messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        assert prompt_messages(conversation.messages) == conversation.messages[:-1]


def test_glaive_converted_tool_calls_pair_with_observations():
    conversations = read_all("glaive/glaive_toolcall_en_demo.json", "glaive")
    source = json.loads((DATA / "glaive/glaive_toolcall_en_demo.json").read_text())
    assert len(conversations) == 300
    calls = results = 0
    for conversation, row in zip(conversations, source):
        assert len(conversation.messages) == len(row["conversations"])
        assert (conversation.tools is None) == (json.loads(row["tools"]) == [])
        for i, (message, turn) in enumerate(zip(conversation.messages, row["conversations"])):
            if turn["from"] == "function_call":
                calls += 1
                (call,) = message["tool_calls"]
                expected = json.loads(turn["value"])
                assert call["function"]["name"] == expected["name"]
                assert json.loads(call["function"]["arguments"]) == expected["arguments"]
            if turn["from"] == "observation":
                results += 1
                call_message = conversation.messages[i - 1]
                assert message["tool_call_id"] == call_message["tool_calls"][0]["id"]
                assert message["content"] == turn["value"]
    assert (calls, results) == (211, 211)
    # rows repeat in this file: identical rows get identical ids, different rows different ones
    distinct_rows = {json.dumps(r, sort_keys=True) for r in source}
    assert len({c.source_id for c in conversations}) == len(distinct_rows) == 265


def test_benchmarks():
    gsm8k = read_all("gsm8k/test.jsonl", "gsm8k")
    assert len(gsm8k) == 1319 and len({c.source_id for c in gsm8k}) == 1319
    assert gsm8k[0].messages[0]["content"].startswith("Janet\u2019s ducks lay 16 eggs per day.")
    mt_bench = read_all("mt_bench/question.jsonl", "mt_bench")
    assert [c.source_id for c in mt_bench] == [str(i) for i in range(81, 161)]
    humaneval = read_all("humaneval/HumanEval.jsonl.gz", "humaneval")
    assert [c.source_id for c in humaneval][:2] == ["HumanEval/0", "HumanEval/1"]
    assert len(humaneval) == 164
    assert humaneval[0].messages[0]["content"].startswith("from typing import List\n\n\ndef ")
    for conversation in gsm8k + humaneval:
        assert [m["role"] for m in conversation.messages] == ["user"]
    for conversation in mt_bench:  # two questions, the reply between them left to the target
        assert [m["role"] for m in conversation.messages] == ["user", "assistant", "user"]
        assert conversation.messages[1]["content"] is None
