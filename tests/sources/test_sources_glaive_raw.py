import json
from pathlib import Path

import pytest

from stages.sources import SourceError, prompt_messages, read_conversations

FIXTURE = Path(__file__).parent / "fixtures" / "glaive_raw.jsonl"


@pytest.fixture(scope="module")
def conversations():
    return list(read_conversations(FIXTURE, "glaive_raw"))


def call(name, arguments, index):
    return {
        "id": f"functions.{name}:{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_calls_responses_and_answers_become_canonical_messages(conversations):
    first = conversations[0]
    assert first.messages == [
        {
            "role": "system",
            "content": "You are a helpful assistant with access to the following "
            "functions. Use them if required",
        },
        {
            "role": "user",
            "content": "Can you tell me the latest news headlines for the United States?",
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("get_news_headlines", {"country": "United States"}, 0)],
        },
        {
            "role": "tool",
            "content": '{"headlines": ["NASA\'s rover collects a rock sample"]}',
            "tool_call_id": "functions.get_news_headlines:0",
            "name": "get_news_headlines",
        },
        {
            "role": "assistant",
            "content": "Here are the latest news headlines for the United "
            "States:\n1. NASA's rover collects a rock sample",
        },
        {"role": "user", "content": "That's interesting. What about the news in France?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("get_news_headlines", {"country": "France"}, 1)],
        },
        {
            "role": "tool",
            "content": '{"headlines": ["Louvre Museum to undergo major overhaul"]}',
            "tool_call_id": "functions.get_news_headlines:1",
            "name": "get_news_headlines",
        },
        {
            "role": "assistant",
            "content": "Here are the latest news headlines for France:\n"
            "1. Louvre Museum to undergo major overhaul",
        },
    ]
    assert [t["function"]["name"] for t in first.tools] == ["get_news_headlines"]
    assert first.tools[0]["type"] == "function"
    assert first.tools[0]["function"]["parameters"]["required"] == ["country"]
    assert all("<|endoftext|>" not in m["content"] for c in conversations for m in c.messages)


def test_system_without_functions_has_no_tools(conversations):
    plain = conversations[1]
    assert plain.tools is None
    assert plain.messages[0] == {
        "role": "system",
        "content": "You are a helpful assistant, with no access to external functions.",
    }
    assert [m["role"] for m in plain.messages] == ["system", "user", "assistant"]


def test_several_functions_and_quoted_arguments_with_apostrophe_and_newline(conversations):
    note = conversations[2]
    assert [t["function"]["name"] for t in note.tools] == ["create_note", "calculate_bmi"]
    arguments = json.loads(note.messages[2]["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"title": "Groceries", "content": "don't forget milk\nthen eggs"}


def test_object_arguments_prose_before_call_and_single_line_chat(conversations):
    bmi = conversations[3]
    assert [m["role"] for m in bmi.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert bmi.messages[1]["content"] == "I weigh 70 kg and I am 1.75 m tall."
    assert bmi.messages[2]["content"] == "Let me calculate that."
    assert json.loads(bmi.messages[2]["tool_calls"][0]["function"]["arguments"]) == {
        "weight": 70,
        "height": 1.75,
    }
    assert bmi.messages[3]["content"] == '{"bmi": 22.86}'
    assert [t["function"]["name"] for t in bmi.tools] == ["calculate_bmi"]


def test_prompt_is_up_to_the_last_user_turn_or_tool_result(conversations):
    assert prompt_messages(conversations[0].messages) == conversations[0].messages[:-1]
    assert prompt_messages(conversations[4].messages) == conversations[4].messages


def test_ids_are_stable_hashes_of_the_row(conversations):
    again = list(read_conversations(FIXTURE, "glaive_raw"))
    assert [c.source_id for c in again] == [c.source_id for c in conversations]
    assert len({c.source_id for c in conversations}) == len(conversations)
    assert all(len(c.source_id) == 16 for c in conversations)


SYSTEM = (
    "SYSTEM: You are a helpful assistant with access to the following functions. Use them "
    'if required -\n{"name": "f", "parameters": {}}\n'
)


@pytest.mark.parametrize(
    "system, chat, fragment",
    [
        (
            SYSTEM,
            "USER: hi\n\n\nFUNCTION RESPONSE: {}\n\n\nASSISTANT: ok",
            "chat turn 2 (FUNCTION RESPONSE) answers no open tool call",
        ),
        (
            SYSTEM,
            'USER: hi\n\n\nASSISTANT: <functioncall> {"name": "f", "arguments": \'{\'} '
            "<|endoftext|>",
            "arguments of 'f' are not valid JSON",
        ),
        (
            SYSTEM,
            "USER: hi\n\n\nASSISTANT: <functioncall> f(x=1) <|endoftext|>",
            'chat turn 2 (ASSISTANT): <functioncall> is not {"name": ..., "arguments": ...}',
        ),
        (SYSTEM, "Hello there. USER: hi", "chat must start with 'USER:'"),
        (SYSTEM, "ASSISTANT: Hello, how can I help?", "no non-empty user turn"),
        (
            'SYSTEM: Use them if required -\n{"name": "f"}\n\n{"name": ',
            "USER: hi",
            "system: function definition 2 is not valid JSON",
        ),
        (
            'SYSTEM: Use them if required -\n{"description": "no name"}',
            "USER: hi",
            "function definition 1 is not an object with a name",
        ),
    ],
)
def test_malformed_rows_name_the_row_and_the_problem(tmp_path, system, chat, fragment):
    path = tmp_path / "glaive.jsonl"
    path.write_text(
        json.dumps({"system": "SYSTEM: plain", "chat": "USER: fine"})
        + "\n"
        + json.dumps({"system": system, "chat": chat})
        + "\n"
    )
    with pytest.raises(SourceError) as caught:
        list(read_conversations(path, "glaive_raw"))
    assert caught.value.row == 2 and caught.value.unit == "line"
    assert fragment in caught.value.reason
    skipped = []
    kept = list(read_conversations(path, "glaive_raw", on_bad_row=skipped.append))
    assert len(kept) == 1 and [e.row for e in skipped] == [2]
