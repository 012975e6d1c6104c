"""regenerate: all_turns_rendered on the demo target with a Kimi-K2.5-style chat template
(tests/fixtures/kimi_k25_style.jinja: earlier replies' reasoning dropped up to the last reply
without tool calls, `preserve_thinking` keeps it, `thinking: false` closes the generation
prompt's reasoning).

The ids-concatenated mode (all_turns) must refuse such a template: its later prompts would hold
reasoning no server renders. The rendered mode sends each later turn what a chat client and a
server would: the template's rendering of the conversation so far, the target's replies held as
messages built from their raw output ids. Each turn is then its own training sequence."""

from __future__ import annotations

import collections
import dataclasses
import json
import re

import pyarrow.parquet as pq
import pytest

from stages.cli import StageError
from stages.engines.hf import HFEngine
from stages.generate import generate_dataset
from stages.merge import merge
from stages.params.datasets import ExpectParams, PrepParams
from stages.params.generate import GenerateParams
from stages.params.merge import MergeParams
from stages.params.target import TargetParams
from stages.prep import prepare
from stages.sources import read_conversations, turn_bounds
from stages.target_model.history import conversation, reply_message
from stages.target_model.model import load_causal_lm
from stages.target_model.tokenizer import pad_id, render_prompt
from stages.target_model.tokens import TokenRoles
from stages.wiring.target import target_roles, target_tokenizer
from tests.conftest import DEMO_TARGET, ROOT
from tests.rawdata import raw_row, write_raw
from tests.stages.conftest import WEATHER, WEATHER_CALL, Recording, same, turns_of

KIMI_TEMPLATE = ROOT / "tests" / "fixtures" / "kimi_k25_style.jinja"
KIMI = TargetParams(
    path=str(DEMO_TARGET), chat_template=str(KIMI_TEMPLATE), device="cpu", dtype="float32"
)
DEMO = dataclasses.replace(KIMI, chat_template=None)
PRESERVE = dataclasses.replace(KIMI, template_kwargs={"preserve_thinking": True})
RENDERED = PrepParams(
    format="sharegpt", path="", max_prompt_tokens=2048, regenerate="all_turns_rendered"
)
GEN = GenerateParams(max_new_tokens=64, batch_size=4, append_every=1)
CONVERSATIONS = [
    {
        "id": "three",
        "conversations": [
            {"from": "human", "value": "Explain what causes the seasons."},
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "Explain what inflation is."},
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "Explain what causes ocean tides."},
        ],
    },
    {
        "id": "result",
        "tools": json.dumps([WEATHER]),
        "conversations": [
            *WEATHER_CALL,
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "Explain what a hash map is."},
        ],
    },
    {"id": "one", "conversations": [{"from": "human", "value": "Explain recursion."}]},
]
TURNS = {"r/three": 3, "r/result": 2, "r/one": 1}


@pytest.fixture(scope="module")
def tok():
    return target_tokenizer(KIMI)


@pytest.fixture(scope="module")
def roles(tok):
    return target_roles(KIMI, tok)


@pytest.fixture(scope="module")
def hf_engine(tok):
    return HFEngine(load_causal_lm(KIMI.path, "cpu", "float32", cpu_threads=1), pad_id(tok), 4)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "chat.json"
    path.write_text(json.dumps(CONVERSATIONS))
    return path


def prep_to(tmp, source, target, mode="all_turns_rendered", expect=True):
    prep = dataclasses.replace(RENDERED, path=str(source), regenerate=mode)
    out = tmp / f"{mode}.parquet"
    prepare("r", prep, ExpectParams(reasoning=expect), target, out, tmp / "report.json")
    return out


@pytest.fixture(scope="module")
def generated(tmp_path_factory, source, hf_engine):
    """Per template kwargs: the prompts file, the raw directory and what the engine was sent."""
    runs = {}
    for name, target in (("default", KIMI), ("preserve", PRESERVE)):
        tmp = tmp_path_factory.mktemp(name)
        prompts = prep_to(tmp, source, target)
        engine = Recording(hf_engine)
        metrics = generate_dataset("r", prompts, tmp / "r", GEN, 10**6, target, engine)
        runs[name] = prompts, tmp / "r", engine.sent, metrics
    return runs


def client_message(tok, output_ids: list[int]) -> dict:
    """What a chat client holds for a reply whose prompt opened reasoning, built here from the
    decoded text (the pipeline splits by token id): reasoning up to the first `</think>`, the
    answer after it, a Kimi tool-call section as structured calls."""
    text = tok.decode(output_ids, skip_special_tokens=False).removesuffix("<|im_end|>")
    reasoning, _, answer = text.partition("</think>")
    message = {"role": "assistant", "content": answer, "reasoning_content": reasoning}
    section = re.fullmatch(
        r"(.*?)<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>.*", answer, re.S
    )
    if section:
        calls = re.findall(
            r"<\|tool_call_begin\|>\s*(functions\.(.+?):\d+)<\|tool_call_argument_begin\|>"
            r"(.*?)<\|tool_call_end\|>",
            section.group(2),
            re.S,
        )
        message["content"] = section.group(1)
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ]
    return message


def sources(path) -> dict:
    return {f"r/{c.source_id}": c for c in read_conversations(path, "sharegpt")}


def test_all_turns_fails_prep_with_a_kimi_style_template(tmp_path, source):
    with pytest.raises(StageError) as err:
        prep_to(tmp_path, source, KIMI, mode="all_turns")
    message = str(err.value)
    for needle in (
        "dataset r: regenerate: all_turns builds each turn's prompt",
        str(KIMI_TEMPLATE),
        "renders a reply differently from how the target writes it",
        "the target writes 'thought</think>reply<|im_end|>'",
        "renders that reply as '</think>reply<|im_end|>'",
        "regenerate: all_turns_rendered",
        "regenerate: last_turn",
        "params: datasets.r.prep.regenerate, target.chat_template, target.template_kwargs",
    ):
        assert needle in message, message
    tok = target_tokenizer(KIMI)
    written, rendered = (
        tok.encode(t) for t in ("thought</think>reply<|im_end|>", "</think>reply<|im_end|>")
    )
    assert (
        f"written {written[:8]}" in message and f"rendered {rendered[:8]}" in message
    )  # the first differing ids
    assert not (tmp_path / "all_turns.parquet").exists()


def test_the_demo_template_keeps_history_and_passes_all_turns(tmp_path, source, tok):
    prompts = prep_to(tmp_path, source, DEMO, mode="all_turns")
    rows = pq.read_table(prompts).to_pylist()
    assert {r["sample_id"]: 1 + len(r["turn_deltas"]) for r in rows} == TURNS
    assert all(r["turn_messages"] == [] for r in rows)


def test_preserve_thinking_keeps_history_and_passes_all_turns(tmp_path, source):
    prompts = prep_to(tmp_path, source, PRESERVE, mode="all_turns")
    assert len(pq.read_table(prompts)) == 3


@pytest.mark.parametrize(
    "kwargs, expect, ending",
    [
        ({}, True, "<|im_assistant|>assistant<|im_middle|><think>"),
        ({"preserve_thinking": True}, True, "<|im_assistant|>assistant<|im_middle|><think>"),
        ({"thinking": False}, False, "<|im_assistant|>assistant<|im_middle|><think></think>"),
    ],
)
def test_the_template_switches_give_the_expected_prompt_endings(
    tmp_path, source, tok, kwargs, expect, ending
):
    target = dataclasses.replace(KIMI, template_kwargs=kwargs)
    rows = {
        r["sample_id"]: r
        for r in pq.read_table(prep_to(tmp_path, source, target, expect=expect)).to_pylist()
    }
    end = tok.encode(ending)
    for row in rows.values():
        assert row["prompt_ids"][-len(end) :] == end and row["reasoning_open"] == expect
        assert len(row["turn_messages"]) == TURNS[row["sample_id"]] and row["turn_deltas"] == []
    declared = tok.decode(rows["r/result"]["prompt_ids"], skip_special_tokens=False)
    assert "namespace functions {\n// Get the current weather for a city\n" in declared
    assert "type get_weather = (_: {\ncity: string\n}) => any;" in declared
    if not expect:  # thinking off with reasoning expected fails, naming the switch
        with pytest.raises(StageError, match="closes reasoning.*target.template_kwargs"):
            prep_to(tmp_path, source, target, expect=True)


@pytest.mark.slow
@pytest.mark.parametrize("run", ["default", "preserve"])
def test_each_later_prompt_is_the_template_rendering_of_the_conversation(
    generated, tok, roles, source, run
):
    prompts, out, sent, metrics = generated[run]
    kwargs = {"preserve_thinking": True} if run == "preserve" else {}
    assert metrics.turns == metrics.new_turns == sum(TURNS.values())
    convs, turns = sources(source), turns_of(out)
    assert {sid: len(rows) for sid, rows in turns.items()} == TURNS
    closed_reasoning = 0
    for sid, rows in turns.items():
        conv = convs[sid]
        segments = [conv.messages[a:b] for a, b in turn_bounds(conv.messages)]
        for k, row in enumerate(rows):
            assert row["prompt_ids"] == sent[f"{sid}@turn{k + 1}"]  # exactly what was sent
            assert row["regenerate"] == "all_turns_rendered" and row["reasoning_open"]
            replies = [client_message(tok, r["output_ids"]) for r in rows[:k]]
            messages = conversation(segments[: k + 1], replies)
            expected = tok.apply_chat_template(
                messages,
                tools=conv.tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **kwargs,
            )
            assert row["prompt_ids"] == expected, (sid, k)
            text = tok.decode(row["prompt_ids"], skip_special_tokens=False)
            for j, (before, reply) in enumerate(zip(rows[:k], replies)):
                if before["reasoning_tokens"] is None or before["reasoning_tokens"] < 8:
                    continue
                closed_reasoning += 1
                # kept with preserve_thinking, or in a tool-call chain no plain reply has closed
                in_flight = all("tool_calls" in r for r in replies[j:])
                kept = run == "preserve" or in_flight
                assert (reply["reasoning_content"] in text) == kept, (sid, k)
                raw = before["output_ids"][: before["reasoning_tokens"]]
                assert contains(row["prompt_ids"], raw) == kept  # the ids themselves
            # every earlier reply's reasoning dropped (default) or kept; the source's own assistant
            # messages (a tool call kept as context) have none to drop
            context = sum(m["role"] == "assistant" for seg in segments[: k + 1] for m in seg)
            dropped = 0 if run == "preserve" else k
            assert text.count("<think></think>") == dropped + context, (sid, k)
    assert closed_reasoning >= 2  # the absence above was checked on real reasoning


def contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


def test_the_reasoning_rule_changes_only_the_history(generated):
    """Turn 1 is the same with either kwarg; later prompts are shorter without the history's
    reasoning."""
    default, preserve = (turns_of(generated[r][1]) for r in ("default", "preserve"))
    for sid in TURNS:
        assert default[sid][0]["prompt_ids"] == preserve[sid][0]["prompt_ids"]
        assert default[sid][0]["output_ids"] == preserve[sid][0]["output_ids"]
    second = default["r/three"][1], preserve["r/three"][1]
    assert second[0]["prompt_len"] < second[1]["prompt_len"]


def test_merge_gives_one_sequence_per_turn(generated, tmp_path):
    _, out, sent, _ = generated["default"]
    report = merge([out], tmp_path, MergeParams(eval_fraction=0.0, max_length=4096))
    merged = {r["sample_id"]: r for r in pq.read_table(tmp_path / "train.parquet").to_pylist()}
    assert set(merged) == {f"{sid}#{k}" for sid, n in TURNS.items() for k in range(1, n + 1)}
    supervised = 0
    for sid, rows in turns_of(out).items():
        for r in rows:
            row = merged[f"{sid}#{r['turn']}"]
            prompt, output = sent[f"{sid}@turn{r['turn']}"], r["output_ids"]
            assert row["input_ids"] == prompt + output and row["length"] == len(prompt + output)
            assert row["loss_spans"] == [[len(prompt), len(prompt) + len(output)]]
            assert row["dataset"] == "r" and not row["truncated"]
            supervised += len(output)
    summary = report.summary.train
    assert (summary.samples, summary.conversations, summary.turns) == (6, 3, 6)
    assert summary.supervised_tokens == supervised and summary.shortened == 0


def test_merge_keeps_a_sample_s_turns_in_one_split_and_dedupes_them_whole(tmp_path):
    def turn(dataset, n, k, mode, prompt_len=5):
        row = raw_row(dataset, n, prompt=f"{dataset != 'c'} question {n}", prompt_len=prompt_len)
        return dict(row, turn=k, regenerate=mode)

    rows = [turn("a", n, k, "all_turns_rendered", 4 + k) for n in range(40) for k in (1, 2, 3)]
    rows += [turn("b", 0, 1, "all_turns_rendered"), turn("b", 0, 2, "all_turns_rendered")]
    rows += [turn("c", 1, 1, None)]  # raw written before the column: concatenated
    write_raw(tmp_path / "raw", rows)
    report = merge([tmp_path / "raw"], tmp_path / "m", MergeParams(eval_fraction=0.5))
    split_of = collections.defaultdict(set)
    for split in ("train", "eval"):
        for r in pq.read_table(tmp_path / "m" / f"{split}.parquet").to_pylist():
            split_of[r["sample_id"].split("#")[0]].add(split)
    assert all(len(s) == 1 for s in split_of.values()) and len(split_of) == 40 + 1
    assert {s for sid, (s,) in split_of.items()} == {"train", "eval"}
    assert "c/1" in split_of and "b/0" not in split_of  # b/0 asks what a/0 asks
    per = [*report.per_dataset.train.values(), *report.per_dataset.eval.values()]
    assert sum(d.duplicates for d in per) == 2
    assert sum(d.samples for d in per) == 40 * 3 + 1


@pytest.mark.slow
def test_a_kill_mid_conversation_loses_and_duplicates_nothing(generated, hf_engine, tmp_path):
    prompts, reference, _, _ = generated["default"]
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        generate_dataset("r", prompts, out, GEN, 10**6, KIMI, Recording(hf_engine, killed_after=3))
    kept = turns_of(out)
    assert sum(map(len, kept.values())) == 3
    assert any(0 < len(rows) < TURNS[sid] for sid, rows in kept.items())  # halfway
    engine = Recording(hf_engine)
    resumed = generate_dataset("r", prompts, out, GEN, 10**6, KIMI, engine)
    assert resumed.new_turns == len(engine.sent) == 6 - 3 and resumed.turns == 6
    assert same(turns_of(out)) == same(turns_of(reference))


# the reply parser alone, on ids built by hand


def ids_of(tok, *parts) -> list[int]:
    """Token strings (`<...>` special tokens) and text, as ids."""
    out: list[int] = []
    for part in parts:
        single = tok.convert_tokens_to_ids(part) if part.startswith("<") else None
        out += [single] if single not in (None, tok.unk_token_id) else tok.encode(part)
    return out


def test_a_tool_call_reply_becomes_structured_calls_and_renders_back_as_written(tok, roles):
    args = json.dumps({"city": "Paris"})
    output = ids_of(
        tok,
        "The user wants the weather.",
        "</think>",
        "Let me check.",
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        "functions.get_weather:0",
        "<|tool_call_argument_begin|>",
        args,
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
        "<|im_end|>",
    )
    message = reply_message(tok, roles, output, reasoning_open=True)
    assert message == {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "The user wants the weather.",
        "tool_calls": [
            {
                "id": "functions.get_weather:0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": args},
            }
        ],
    }
    user = [{"role": "user", "content": "What is the weather in Paris?"}]
    prompt = render_prompt(tok, user, [WEATHER], {})
    # in flight (no plain reply after it): the template renders it exactly as the target wrote it
    assert render_prompt(tok, [*user, message], [WEATHER], {}, generation=False) == prompt + output
    # once a plain reply closes the exchange, its reasoning is dropped
    later = [
        *user,
        message,
        {"role": "tool", "content": "21", "tool_call_id": "functions.get_weather:0"},
    ]
    plain = {"role": "assistant", "content": "It is 21.", "reasoning_content": "Easy."}
    text = tok.decode(
        render_prompt(tok, [*later, plain, *user], [WEATHER], {}), skip_special_tokens=False
    )
    assert "The user wants the weather." not in text and "Easy." not in text
    assert "<think></think>Let me check.<|tool_calls_section_begin|>" in text


@pytest.mark.parametrize(
    "parts, reasoning_open, expected",
    [
        (  # cut at max_new_tokens inside the reasoning: all reasoning, no answer
            ("Thinking about",),
            True,
            {"content": "", "reasoning_content": "Thinking about"},
        ),
        (  # K2-Thinking: the template leaves opening reasoning to the target
            ("<think>", "Hm.", "</think>", "Done.", "<|im_end|>"),
            False,
            {"content": "Done.", "reasoning_content": "Hm."},
        ),
        (  # thinking off: no reasoning at all
            ("Done.", "<|im_end|>"),
            False,
            {"content": "Done."},
        ),
        (  # an unclosed call is no call: the answer stays text, as a server returns it
            (
                "Hm.",
                "</think>",
                "Go",
                "<|tool_calls_section_begin|>",
                "<|tool_call_begin|>",
                "functions.f:0",
            ),
            True,
            {
                "content": "Go<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0",
                "reasoning_content": "Hm.",
            },
        ),
    ],
)
def test_replies_split_by_token_role(tok, roles, parts, reasoning_open, expected):
    message = reply_message(tok, roles, ids_of(tok, *parts), reasoning_open)
    assert message == {"role": "assistant", **expected}


def test_json_tool_calls_without_section_tokens(tok, roles):
    hermes = TokenRoles(**{**roles.as_dict(), "tool_section_begin": None, "tool_section_end": None})
    output = ids_of(
        tok,
        "Sure.",
        "<|tool_call_begin|>",
        json.dumps({"name": "f", "arguments": {"x": 1}}),
        "<|tool_call_end|>",
        "<|im_end|>",
    )
    message = reply_message(tok, hermes, output, reasoning_open=False)
    assert message == {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    }
