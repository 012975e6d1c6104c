"""ShareGPT, OpenAI messages, column mappings and the registry, on fixtures and inline rows."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.sources import FORMATS, SourceError, prompt_messages, read_conversations

FIXTURES = Path(__file__).parent / "fixtures"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def read_one(tmp_path, record, format, **kwargs):
    return next(read_conversations(write_jsonl(tmp_path / "one.jsonl", [record]), format, **kwargs))


def error_of(tmp_path, record, format, **kwargs):
    with pytest.raises(SourceError) as caught:
        read_one(tmp_path, record, format, **kwargs)
    return caught.value


def test_registry_names():
    assert set(FORMATS) == {
        "sharegpt",
        "openai_messages",
        "glaive",
        "glaive_raw",
        "opencodeinstruct",
        "magicoder_oss",
        "magicoder_evol",
        "gsm8k",
        "mt_bench",
        "humaneval",
        "columns",
    }


# ShareGPT ----------------------------------------------------------------------------------------


def test_sharegpt_speaker_variants_system_and_empty_turns(tmp_path):
    record = {
        "id": "abc_0",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "user", "value": "   "},
            {"from": "User", "value": "Name a colour."},
            {"from": "chatgpt", "value": "Blue."},
            {"from": "bing", "value": ""},
        ],
    }
    conversation = read_one(tmp_path, record, "sharegpt")
    assert conversation.source_id == "abc_0" and conversation.tools is None
    assert conversation.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
    ]
    assert prompt_messages(conversation.messages) == conversation.messages[:4]


def test_sharegpt_function_call_list_and_observations_pair_in_order(tmp_path):
    record = {
        "system": "Use tools.",
        "tools": json.dumps([{"name": "a"}, {"name": "b"}]),
        "conversations": [
            {"from": "human", "value": "Do a and b"},
            {
                "from": "function_call",
                "value": json.dumps(
                    [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{}"}]
                ),
            },
            {"from": "observation", "value": "A done"},
            {"from": "observation", "value": "B done"},
            {"from": "gpt", "value": "Both done."},
        ],
    }
    conversation = read_one(tmp_path, record, "glaive")
    assert conversation.messages[0] == {"role": "system", "content": "Use tools."}
    calls = conversation.messages[2]["tool_calls"]
    assert [(c["id"], c["function"]["arguments"]) for c in calls] == [
        ("functions.a:0", '{"x": 1}'),
        ("functions.b:1", "{}"),
    ]
    assert [(m["tool_call_id"], m["name"], m["content"]) for m in conversation.messages[3:5]] == [
        ("functions.a:0", "a", "A done"),
        ("functions.b:1", "b", "B done"),
    ]
    assert conversation.tools == [
        {"type": "function", "function": {"name": "a"}},
        {"type": "function", "function": {"name": "b"}},
    ]


@pytest.mark.parametrize(
    "record, fragment",
    [
        ({"id": "x"}, "missing field 'conversations' (fields present: id)"),
        ({"conversations": []}, "no non-empty user turn"),
        (
            {"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": " "}]},
            "no non-empty user turn",
        ),
        (
            {"conversations": [{"from": "narrator", "value": "Once"}]},
            "conversations[0]: unknown speaker 'narrator'; expected one of human, user, gpt",
        ),
        (
            {"conversations": [{"from": "human"}]},
            "conversations[0]: missing field 'value' (fields present: from)",
        ),
        (
            {"conversations": [{"from": "human", "value": None}]},
            "conversations[0]: field 'value' is null, expected a string",
        ),
        ({"conversations": ["hi"]}, "conversations[0] is a string, expected an object"),
        (
            {
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "observation", "value": "{}"},
                ]
            },
            "conversations[1] answers no open tool call",
        ),
        (
            {
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "function_call", "value": '{"arguments": {}}'},
                ]
            },
            "conversations[1]: missing field 'name'",
        ),
        (
            {"conversations": [{"from": "human", "value": "hi"}], "tools": "[{"},
            "tools is a string but not valid JSON",
        ),
        (
            {"conversations": [{"from": "human", "value": "hi"}], "id": ""},
            "field 'id' is an empty id",
        ),
    ],
)
def test_sharegpt_malformed_rows(tmp_path, record, fragment):
    error = error_of(tmp_path, record, "sharegpt")
    assert (error.row, error.unit) == (1, "line")
    assert fragment in error.reason


def test_user_turn_closes_open_calls(tmp_path):
    record = {
        "conversations": [
            {"from": "human", "value": "hi"},
            {"from": "function_call", "value": '{"name": "a"}'},
            {"from": "human", "value": "never mind"},
            {"from": "observation", "value": "late"},
        ]
    }
    assert (
        "conversations[3] answers no open tool call"
        in error_of(tmp_path, record, "sharegpt").reason
    )


# OpenAI messages ---------------------------------------------------------------------------------


def test_ultrachat_rows_and_tool_calls():
    plain, weather = read_conversations(FIXTURES / "ultrachat.jsonl", "openai_messages")
    assert plain.source_id.startswith("a3f9c1e2") and plain.tools is None
    assert [m["role"] for m in plain.messages] == ["user", "assistant", "user", "assistant"]
    assert weather.source_id == "b1"
    assert weather.messages[1] == {"role": "user", "content": "What's the weather in Paris?"}
    assert weather.messages[2]["content"] == ""
    assert [(c["id"], c["function"]["arguments"]) for c in weather.messages[2]["tool_calls"]] == [
        ("call_1", '{"city": "Paris"}'),
        ("call_2", '{"city": "Paris"}'),
    ]
    assert [(m["tool_call_id"], m["name"]) for m in weather.messages[3:5]] == [
        ("call_2", "get_time"),
        ("call_1", "get_weather"),
    ]
    assert [t["function"]["name"] for t in weather.tools] == ["get_weather", "get_time"]
    assert all(t["type"] == "function" for t in weather.tools)
    assert prompt_messages(weather.messages) == weather.messages[:5]


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([{"role": "narrator", "content": "x"}], "messages[0]: unknown role 'narrator'; expected"),
        ([{"role": "user"}], "messages[0]: missing field 'content'"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
            "messages[0].content[0] is a 'image_url' part; only text parts are read",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "f"}, "id": "c1"}],
                },
                {"role": "tool", "tool_call_id": "c9", "content": "r"},
            ],
            "messages[2] answers call id 'c9', which no open tool call has",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": {"name": "f"}},
            ],
            "messages[1].tool_calls is an object, expected a list",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}],
                },
            ],
            "arguments of 'f' are a list, expected a JSON object",
        ),
        ("not json", "messages is a string but not valid JSON"),
    ],
)
def test_openai_malformed_messages(tmp_path, messages, fragment):
    assert fragment in error_of(tmp_path, {"messages": messages}, "openai_messages").reason


def test_developer_role_is_system_and_ids_fall_back(tmp_path):
    conversation = read_one(
        tmp_path,
        {
            "id": 7,
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": "q"},
            ],
        },
        "openai_messages",
    )
    assert conversation.source_id == "7"
    assert conversation.messages[0] == {"role": "system", "content": "Be terse."}


# Column mappings ---------------------------------------------------------------------------------


def test_columns_prompt_response_system_id(tmp_path):
    record = {"uid": 42, "sys": "You grade maths.", "question": "1+1?", "answer": "2", "extra": 0}
    conversation = read_one(
        tmp_path,
        record,
        "columns",
        columns={"prompt": "question", "response": "answer", "system": "sys", "id": "uid"},
    )
    assert conversation.source_id == "42"
    assert conversation.messages == [
        {"role": "system", "content": "You grade maths."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
    ]


def test_columns_messages_from_parquet_structs_and_json_strings(tmp_path):
    path = tmp_path / "dialogs.parquet"
    dialog = [
        {"role": "user", "content": "hi", "tool_calls": None},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
    ]
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"dialog": dialog, "functions": json.dumps([{"name": "f", "description": None}])},
                {"dialog": dialog[:1], "functions": None},
            ]
        ),
        path,
    )
    first, second = read_conversations(
        path, "columns", columns={"messages": "dialog", "tools": "functions"}
    )
    assert first.messages[1]["tool_calls"][0]["id"] == "c1"
    assert first.tools == [{"type": "function", "function": {"name": "f"}}]
    assert second.tools is None and second.messages == [{"role": "user", "content": "hi"}]
    assert first.source_id != second.source_id


def test_columns_round_trip_of_the_prompts_artifact_shape(tmp_path):
    messages = [{"role": "user", "content": "hi"}]
    record = {"sample_id": "ds/1", "messages": json.dumps(messages), "tools": None}
    conversation = read_one(
        tmp_path,
        record,
        "columns",
        columns={"messages": "messages", "tools": "tools", "id": "sample_id"},
    )
    assert (conversation.source_id, conversation.messages, conversation.tools) == (
        "ds/1",
        messages,
        None,
    )


def test_columns_missing_column_names_what_exists(tmp_path):
    error = error_of(tmp_path, {"q": "hi", "a": "yo"}, "columns", columns={"prompt": "question"})
    assert error.reason == "missing field 'question' (fields present: q, a)"


@pytest.mark.parametrize(
    "format, columns, fragment",
    [
        ("columns", None, "format 'columns' needs a mapping"),
        ("columns", {"promt": "q"}, "unknown column mapping key 'promt'"),
        ("columns", {"prompt": ""}, "column mapping 'prompt' must name a column"),
        ("columns", {"prompt": "q", "messages": "m"}, "exactly one of 'prompt' or 'messages'"),
        ("columns", {"messages": "m", "response": "r"}, "'response' goes with 'prompt'"),
        ("sharegpt", {"prompt": "q"}, "format 'sharegpt': this format has a fixed schema"),
        ("alpaca", None, "unknown format 'alpaca'; known formats: sharegpt, openai_messages"),
    ],
)
def test_bad_format_or_mapping_fails_before_reading(tmp_path, format, columns, fragment):
    with pytest.raises(SourceError) as caught:
        read_conversations(tmp_path / "not_read.jsonl", format, columns=columns)
    assert caught.value.row is None and fragment in caught.value.reason


# Code instruction presets ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "format, file, ids, prompt_start, response_start",
    [
        (
            "opencodeinstruct",
            "opencodeinstruct.jsonl",
            ["5d1d6a4c0b0e4e6f8f0b9c6b4b8c0e1a", "7e2f9b3a1c4d4e5f9a0b1c2d3e4f5a6b"],
            "Write a function `is_even(n)`",
            "```python\ndef is_even",
        ),
        (
            "magicoder_oss",
            "magicoder_oss.jsonl",
            ["0", "1"],
            "You are given a function `add`",
            "```python\nassert",
        ),
        (
            "magicoder_evol",
            "magicoder_evol.json",
            None,
            "Explain list comprehensions",
            "A list comprehension",
        ),
    ],
)
def test_code_instruction_formats(format, file, ids, prompt_start, response_start):
    conversations = list(read_conversations(FIXTURES / file, format))
    assert len(conversations) == 2
    if ids is not None:
        assert [c.source_id for c in conversations] == ids
    else:
        assert len({c.source_id for c in conversations}) == 2
    user, assistant = conversations[0].messages
    assert user["role"] == "user" and user["content"].startswith(prompt_start)
    assert assistant["role"] == "assistant" and assistant["content"].startswith(response_start)
    assert prompt_messages(conversations[0].messages) == [user]


def test_preset_missing_column_is_reported(tmp_path):
    error = error_of(tmp_path, {"id": "x", "prompt": "p", "output": "o"}, "opencodeinstruct")
    assert error.reason == "missing field 'input' (fields present: id, prompt, output)"


def test_mt_bench_keeps_every_question_with_the_replies_left_to_the_target(tmp_path):
    conversation = read_one(
        tmp_path,
        {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
        "mt_bench",
    )
    assert conversation.source_id == "81"
    assert conversation.messages == [
        {"role": "user", "content": "Write a poem."},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "Now shorter."},
    ]
    assert prompt_messages(conversation.messages) == conversation.messages[:1]
    for turns in ([], ["Write a poem.", 2]):
        assert (
            "list of question strings"
            in error_of(tmp_path, {"question_id": 1, "turns": turns}, "mt_bench").reason
        )
