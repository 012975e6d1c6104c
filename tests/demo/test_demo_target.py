"""The embedded demo target: builder (at a tiny scale), chat template, corpus and prompt files."""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from demo import build_target, corpus
from demo.build_target import (
    SPECIAL_TOKENS,
    BuildConfig,
    build,
    describe_reply,
    encode,
    greedy_replies,
)
from demo.write_prompts import write_prompts

COMMITTED_TARGET = Path(__file__).resolve().parents[2] / "data" / "demo" / "target"
TINY = BuildConfig(
    steps=3,
    conversations=80,
    vocab_size=600,
    hidden_size=32,
    intermediate_size=64,
    layers=2,
    heads=4,
    kv_heads=2,
    batch_tokens=2048,
    warmup_steps=1,
    demo_prompts=2,
    max_new_tokens=4,
)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("demo") / "target"
    out.mkdir()
    (out / "stale.txt").write_text("replaced by the build")
    return out, build(out, TINY)


@pytest.fixture(scope="module")
def tokenizer(tiny_target):
    return AutoTokenizer.from_pretrained(tiny_target[0])


# --- builder ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_build_writes_a_standard_directory_atomically(tiny_target):
    out, info = tiny_target
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "build_info.json",
    } <= names
    assert "stale.txt" not in names
    assert [p.name for p in out.parent.iterdir()] == ["target"]  # no staging left behind
    assert "chat_template" in json.loads((out / "tokenizer_config.json").read_text())
    saved = json.loads((out / "build_info.json").read_text())
    assert saved == json.loads(json.dumps(info))
    assert saved["seed"] == 0 and saved["steps"] == 3 and saved["final_loss"] > 0
    assert saved["demo"]["prompts"] == 4 * TINY.demo_prompts
    assert set(saved["demo"]["mean_reply_tokens"]) == {"function_calling", "code", "chat"}


@pytest.mark.slow
def test_failed_build_keeps_the_previous_target_and_leaves_nothing_behind(tmp_path, monkeypatch):
    out = tmp_path / "target"
    out.mkdir()
    (out / "config.json").write_text("{}")

    def broken(directory, config):
        raise RuntimeError("measuring failed")

    monkeypatch.setattr(build_target, "measure_saved", broken)
    with pytest.raises(RuntimeError, match="measuring failed"):
        build(out, TINY)
    assert [p.name for p in tmp_path.iterdir()] == ["target"]
    assert [p.name for p in out.iterdir()] == ["config.json"]
    with pytest.raises(ValueError, match="raise max_positions"):
        build(out, dataclasses.replace(TINY, max_positions=64))


def test_model_loads_back_with_the_requested_shape(tiny_target, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_target[0])
    config = model.config
    assert (
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
    ) == (2, 32, 4, 2)
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.eos_token_id == config.eos_token_id
    assert next(model.parameters()).dtype == torch.bfloat16


def test_special_tokens_are_single_ids_with_kimi_roles(tokenizer):
    for token in SPECIAL_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tokenizer.convert_ids_to_tokens(ids) == [token]
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.bos_token, tokenizer.unk_token) == (
        "<|im_end|>",
        "[PAD]",
        "[BOS]",
        "[UNK]",
    )
    assert tokenizer.encode("hello", add_special_tokens=True) == tokenizer.encode(
        "hello", add_special_tokens=False
    )  # no BOS added automatically


def test_byte_level_tokenizer_round_trips_any_text(tokenizer):
    text = "où est la gare? ∑ 3.14 <think> 🙂 </think>\n    return x"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


# --- chat template ----------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather",
            "parameters": {"type": "object"},
        },
    }
]


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def test_template_declares_tools_then_system_user_and_opens_reasoning(tokenizer):
    text = render(
        tokenizer,
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
        ],
        tools=TOOLS,
        add_generation_prompt=True,
    )
    assert text == (
        '<|im_system|>tool_declare<|im_middle|>[{"type": "function", "function": {"name": '
        '"get_weather", "description": "Weather", "parameters": {"type": "object"}}}]<|im_end|>'
        "<|im_system|>system<|im_middle|>Be brief.<|im_end|>"
        "<|im_user|>user<|im_middle|>Weather in Oslo?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_template_renders_tool_calls_and_tool_results(tokenizer):
    call = {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    text = render(
        tokenizer,
        [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "reasoning_content": "Call it.",
                "content": "",
                "tool_calls": [call, call],
            },
            {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"t": 3}'},
            {"role": "tool", "name": "get_weather", "content": '{"t": 4}'},
        ],
        add_generation_prompt=True,
    )
    assert text == (
        "<|im_user|>user<|im_middle|>Weather?<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Call it.</think>"
        "<|tool_calls_section_begin|>"
        '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Oslo"}'
        "<|tool_call_end|>"
        '<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{"city": "Oslo"}'
        "<|tool_call_end|>"
        "<|tool_calls_section_end|><|im_end|>"
        '<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n{"t": 3}<|im_end|>'
        '<|im_system|>tool<|im_middle|>## Return of get_weather\n{"t": 4}<|im_end|>'
        "<|im_assistant|>assistant<|im_middle|><think>"
    )


def test_template_multi_turn_and_thinking_off(tokenizer):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    history = (
        "<|im_user|>user<|im_middle|>Hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think></think>Hello!<|im_end|>"
        "<|im_user|>user<|im_middle|>Bye<|im_end|>"
    )
    assert render(tokenizer, messages) == history
    assert render(tokenizer, messages, add_generation_prompt=True, thinking=False) == (
        history + "<|im_assistant|>assistant<|im_middle|><think></think>"
    )
    assert render(tokenizer, messages, add_generation_prompt=True, thinking=True).endswith(
        "<|im_middle|><think>"
    )


def test_template_rejects_unknown_roles(tokenizer):
    with pytest.raises(Exception, match="unknown role narrator"):
        render(tokenizer, [{"role": "narrator", "content": "x"}])


def test_encode_matches_apply_chat_template_and_splits_at_the_reply(tokenizer):
    conversation = corpus.function_calling(random.Random(5), with_result=True)
    ids, prompt_len = encode(tokenizer, conversation)
    prompt_ids = tokenizer.apply_chat_template(
        conversation.prompt,
        tools=conversation.tools,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert ids[:prompt_len] == list(prompt_ids)
    assert tokenizer.convert_ids_to_tokens(ids[prompt_len - 1]) == "<think>"
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == "<|im_end|>"
    assert tokenizer.decode(ids[prompt_len:]) == (
        f"{conversation.reply['reasoning_content']}</think>{conversation.reply['content']}"
        "<|im_end|>"
    )


# --- measuring replies ------------------------------------------------------------------------


def test_describe_reply_finds_reasoning_end_and_tool_calls(tokenizer):
    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    good = describe_reply(
        tokenizer,
        ids(
            "Plan.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
            '<|tool_call_argument_begin|>{"a": 1}<|tool_call_end|><|tool_calls_section_end|>'
            "<|im_end|>"
        ),
    )
    assert good["well_formed"] and good["tool_calls"] == [("f", {"a": 1})]
    broken = describe_reply(
        tokenizer,
        ids(
            "Plan.</think><|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
            '<|tool_call_argument_begin|>{"a": <|tool_call_end|><|tool_calls_section_end|>'
        ),
    )
    assert not broken["well_formed"] and not broken["ended"]
    assert broken["tool_calls"] == [("f", None)]
    assert not describe_reply(tokenizer, ids("never closes<|im_end|>"))["closed_reasoning"]


# --- corpus -----------------------------------------------------------------------------------


def test_corpus_is_deterministic_per_seed():
    first, again, other = (corpus.training_corpus(60, s) for s in (3, 3, 4))
    assert first == again and first != other
    assert {c.kind for c in first} == set(corpus.KINDS)
    assert corpus.demo_conversations(5) == corpus.demo_conversations(5)


def test_demo_requests_never_appear_in_training():
    train = corpus.training_corpus(400, 0)
    demo = [c for source in corpus.demo_conversations(20).values() for c in source]
    train_requests = {m["content"] for c in train for m in c.messages if m["role"] == "user"}
    assert not train_requests & {c.request for c in demo}
    assert all(corpus.in_demo_split(c.request) for c in demo)


def test_training_corpus_varies_only_what_does_not_change_the_reply():
    train = corpus.training_corpus(400, 1)
    assert any(not c.thinking and c.reply["reasoning_content"] == "" for c in train)
    assert any(c.messages[0]["role"] == "system" for c in train)
    assert any(c.messages[0]["role"] == "user" for c in train)
    assert any(sum(m["role"] == "user" for m in c.messages) == 2 for c in train)
    for c in train:
        if c.kind == "function_calling" and not any(m["role"] == "tool" for m in c.messages):
            offered = {t["function"]["name"] for t in c.tools}
            assert c.reply["tool_calls"][0]["function"]["name"] in offered


def test_replies_follow_the_words_of_the_prompt():
    rng = random.Random(0)
    for _ in range(30):
        weather = corpus.function_calling(rng)
        city = re.search("|".join(corpus.CITIES), weather.request)
        call = weather.messages[-1].get("tool_calls") or weather.messages[-3]["tool_calls"]
        if call[0]["function"]["name"] == "get_weather":
            assert json.loads(call[0]["function"]["arguments"])["city"] == city.group()
        program = corpus.code(rng)
        name = re.search(r"`(\w+)`", program.request).group(1)
        assert f"def {name}(" in program.reply["content"]


@pytest.mark.parametrize("task", corpus.CODE_TASKS, ids=lambda t: t.names[0])
def test_every_program_runs_and_prints_what_it_claims(task, capsys):
    for name in task.names:
        source = corpus.program(task, name, frozenset(corpus.OPTIONS))
        exec(compile(source, name, "exec"), {"__name__": "__main__"})
        printed = capsys.readouterr().out.strip()
        assert source.rstrip().endswith(f"# {printed}")


# --- prompt files -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory) -> dict[str, Path]:
    return write_prompts(tmp_path_factory.mktemp("prompts"), per_source=12)


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_glaive_rows_have_the_raw_v2_shape(prompt_files):
    rows = _jsonl(prompt_files["glaive_fc"])
    assert len(rows) == 12
    header = (
        "SYSTEM: You are a helpful assistant with access to the following functions. "
        "Use them if required -\n"
    )
    for row in rows:
        assert set(row) == {"system", "chat"} and row["system"].startswith(header)
        for definition in row["system"][len(header) :].strip().split("\n\n"):
            assert set(json.loads(definition)) == {"name", "description", "parameters"}
        assert row["chat"].startswith("USER: ")
        for call in re.findall(r"<functioncall> (.*?) <\|endoftext\|>", row["chat"]):
            quoted = re.fullmatch(r"""\{"name": "(\w+)", "arguments": '(.*)'\}""", call)
            assert quoted and isinstance(json.loads(quoted.group(2)), dict)
    assert any("FUNCTION RESPONSE: " in row["chat"] for row in rows)
    assert any("FUNCTION RESPONSE: " not in row["chat"] for row in rows)


def test_code_rows_have_the_published_columns_and_passing_tests(prompt_files):
    for row in _jsonl(prompt_files["opencodeinstruct"]):
        assert list(row) == [
            "id",
            "input",
            "output",
            "domain",
            "generation_algorithm",
            "llm_judgement",
            "unit_tests",
            "tests_execution_status",
            "average_test_score",
        ]
        assert all(isinstance(value, str) for value in row.values())
        scope: dict = {}
        exec(re.search(r"```python\n(.*?)```", row["output"], re.S).group(1), scope)
        for test in json.loads(row["unit_tests"]):
            exec(test, scope)
    for index, row in enumerate(_jsonl(prompt_files["magicoder"])):
        assert list(row) == [
            "lang",
            "raw_index",
            "index",
            "seed",
            "openai_fingerprint",
            "problem",
            "solution",
        ]
        assert row["index"] == index and isinstance(row["raw_index"], int)
        assert row["lang"] == "python"
        assert all(line.strip() in row["solution"] for line in row["seed"].splitlines())


def test_sharegpt_rows_have_ids_and_human_gpt_turns(prompt_files):
    rows = json.loads(prompt_files["sharegpt"].read_text())
    assert len({row["id"] for row in rows}) == len(rows) == 12
    for row in rows:
        assert [turn["from"] for turn in row["conversations"]] == ["human", "gpt"]


def test_prompt_files_are_reproducible(prompt_files, tmp_path):
    again = write_prompts(tmp_path, per_source=12)
    assert all(again[s].read_bytes() == prompt_files[s].read_bytes() for s in prompt_files)


def test_source_adapters_read_back_the_demo_prompts(prompt_files):
    sources = pytest.importorskip("stages.sources")
    formats = {
        "glaive_fc": "glaive_raw",
        "opencodeinstruct": "opencodeinstruct",
        "magicoder": "magicoder_oss",
        "sharegpt": "sharegpt",
    }
    demo = corpus.demo_conversations(12)
    for source, fmt in formats.items():
        read = list(sources.read_conversations(prompt_files[source], fmt))
        assert [sources.prompt_messages(c.messages) for c in read] == [
            c.prompt for c in demo[source]
        ]
        assert [c.tools for c in read] == [c.tools for c in demo[source]]


# --- the committed target ---------------------------------------------------------------------


@pytest.mark.skipif(
    not (COMMITTED_TARGET / "model.safetensors").exists(), reason="data/demo/target is not built"
)
@pytest.mark.slow
def test_committed_target_reasons_then_answers_or_calls_a_tool():
    tokenizer = AutoTokenizer.from_pretrained(COMMITTED_TARGET)
    model = AutoModelForCausalLM.from_pretrained(COMMITTED_TARGET, dtype=torch.float32)
    demo = corpus.demo_conversations(6)
    chosen = demo["glaive_fc"][:4] + demo["sharegpt"][:2] + demo["opencodeinstruct"][:1]
    prompts = [ids[:n] for ids, n in (encode(tokenizer, c) for c in chosen)]
    replies = greedy_replies(model, tokenizer, prompts, max_new_tokens=512)
    assert greedy_replies(model, tokenizer, prompts[:2], max_new_tokens=512) == replies[:2]
    for conversation, reply in zip(chosen, replies):
        described = describe_reply(tokenizer, reply)
        assert described["well_formed"], described["text"]
        expected = conversation.reply.get("tool_calls")
        if expected:  # a complete call of the right tool, with every required argument
            [(name, arguments)] = described["tool_calls"]
            assert name == expected[0]["function"]["name"]
            assert set(corpus.FUNCTIONS[name]["parameters"]["required"]) <= set(arguments)
        else:
            assert not described["tool_calls"]
