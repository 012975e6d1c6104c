"""regenerate: all_turns on the demo target: every assistant turn written by the target on its own
earlier turns, id for id, through both engines, resumed after a kill, merged into one sequence per
conversation with exactly the target's turns supervised."""

from __future__ import annotations

import collections
import dataclasses
import json

import pyarrow.parquet as pq
import pytest

from stages.artifacts.hidden import span_mask
from stages.artifacts.raw import read_raw
from stages.cli import StageError
from stages.engines.hf import HFEngine
from stages.generate import generate_dataset
from stages.merge import merge
from stages.params.datasets import ExpectParams, PrepParams
from stages.params.generate import GenerateParams, SGLangParams
from stages.params.merge import MergeParams
from stages.params.target import TargetParams
from stages.prep import prepare
from stages.sources import read_conversations, turn_bounds
from stages.target_model.model import load_causal_lm
from stages.target_model.tokenizer import pad_id, render_prompt
from stages.vocab import supervised_counts
from stages.wiring.target import target_roles, target_tokenizer
from tests.conftest import DEMO_TARGET, ROOT, SHARED
from tests.doubles.hf_server import HFServer, model_eos_ids
from tests.rawdata import write_raw
from tests.stages.conftest import WEATHER, WEATHER_CALL, Recording, same, turns_of

CONVERSATIONS = [
    {
        "id": "three",
        "conversations": [
            {"from": "human", "value": "Explain what a hash map is."},
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "Write a function that counts words."},
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "Explain what a linked list is."},
            {"from": "gpt", "value": "-"},
        ],
    },
    {
        "id": "two",
        "conversations": [
            {"from": "human", "value": "Write a function that reverses a string."},
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "What is the capital of France?"},
        ],
    },
    {"id": "one", "conversations": [{"from": "human", "value": "Explain recursion."}]},
    {
        "id": "tool",
        "tools": json.dumps([WEATHER]),
        "conversations": [
            *WEATHER_CALL,
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "What is the weather in Rome?"},
        ],
    },
]
TARGET = TargetParams(path=str(DEMO_TARGET), device="cpu", dtype="float32")
GEN = GenerateParams(max_new_tokens=40, batch_size=4, append_every=1)
ALL_TURNS = PrepParams(format="sharegpt", path="", max_prompt_tokens=1024, regenerate="all_turns")
MAX_LENGTH = 4096


@pytest.fixture(scope="module")
def tok():
    return target_tokenizer(TARGET)


@pytest.fixture(scope="module")
def eot(tok):
    return target_roles(TARGET, tok).end_of_turn


@pytest.fixture(scope="module")
def hf_engine(tok):
    return HFEngine(load_causal_lm(TARGET.path, "cpu", "float32", cpu_threads=1), pad_id(tok), 4)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prompts")
    (tmp / "chat.json").write_text(json.dumps(CONVERSATIONS))
    prep = dataclasses.replace(ALL_TURNS, path=str(tmp / "chat.json"))
    counts = prepare(
        "chat", prep, ExpectParams(), TARGET, tmp / "chat.parquet", tmp / "chat.json.report"
    )
    return tmp / "chat.parquet", counts


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prompts, hf_engine):
    """The dataset generated in one go, with what the engine was sent."""
    out = tmp_path_factory.mktemp("raw") / "chat"
    engine = Recording(hf_engine)
    metrics = generate_dataset("chat", prompts[0], out, GEN, 10**6, TARGET, engine)
    return out, engine.sent, metrics


def closed(output, eot):
    return output if output[-1] == eot else output + [eot]


def test_prep_plans_each_turn_as_the_template_renders_it(prompts, tok, eot):
    path, counts = prompts
    rows = {r["sample_id"]: r for r in pq.read_table(path).to_pylist()}
    assert counts["kept"] == 4 and counts["turns"] == 3 + 2 + 1 + 2
    sources = {c.source_id: c for c in read_conversations(path.with_suffix(".json"), "sharegpt")}
    for sid, row in rows.items():
        conv = sources[sid.split("/")[1]]
        bounds = turn_bounds(conv.messages)
        assert len(row["turn_deltas"]) == len(bounds) - 1
        history = conv.messages[: bounds[0][1]]
        prompt = row["prompt_ids"]
        assert prompt == render_prompt(tok, history, conv.tools, {})
        for k, (start, end) in enumerate(bounds[1:]):
            # a reply as the template renders it, then the next turn's messages
            reply = {"role": "assistant", "content": f"Answer {k}.", "reasoning_content": "Hm."}
            replied = render_prompt(tok, [*history, reply], conv.tools, {}, generation=False)
            history = [*history, reply, *conv.messages[start:end]]
            expected = render_prompt(tok, history, conv.tools, {})
            output = replied[len(prompt) :]
            prompt = prompt + closed(output, eot) + row["turn_deltas"][k]
            assert prompt == expected
    tool_turn_1 = tok.decode(rows["chat/tool"]["prompt_ids"], skip_special_tokens=False)
    assert "get_weather" in tool_turn_1 and '"sky": "clear"' in tool_turn_1  # the source call kept


@pytest.mark.slow
def test_each_turn_continues_the_ids_of_the_turn_before(reference, prompts, eot):
    out, sent, metrics = reference
    deltas = {r["sample_id"]: r["turn_deltas"] for r in pq.read_table(prompts[0]).to_pylist()}
    turns = turns_of(out)
    assert metrics.samples == 4 and metrics.turns == metrics.new_turns == 8
    assert {sid: len(t) for sid, t in turns.items()} == {
        "chat/three": 3,
        "chat/two": 2,
        "chat/one": 1,
        "chat/tool": 2,
    }
    assert sorted(sent) == sorted(f"{sid}@turn{r['turn']}" for sid, t in turns.items() for r in t)
    for sid, rows in turns.items():
        for k, row in enumerate(rows):
            assert row["prompt_ids"] == sent[f"{sid}@turn{k + 1}"]  # exactly what was sent
            if k:
                before = rows[k - 1]
                assert row["prompt_ids"] == (
                    before["prompt_ids"] + closed(before["output_ids"], eot) + deltas[sid][k - 1]
                )
    reasons = {r["finish_reason"] for rows in turns.values() for r in rows}
    assert reasons == {"stop", "length"}  # both ends of a turn are continued from


def test_merge_gives_one_sequence_with_exactly_the_target_turns_supervised(
    reference, tok, tmp_path
):
    out, sent, _ = reference
    report = merge([out], tmp_path, MergeParams(eval_fraction=0.0, max_length=MAX_LENGTH))
    merged = {r["sample_id"]: r for r in pq.read_table(tmp_path / "train.parquet").to_pylist()}
    outputs = collections.Counter()
    for sid, rows in turns_of(out).items():
        row, last = merged[sid], rows[-1]
        assert row["input_ids"] == last["prompt_ids"] + last["output_ids"]
        assert row["loss_spans"] == [
            [r["prompt_len"], r["prompt_len"] + len(r["output_ids"])] for r in rows
        ]
        for r, (start, end) in zip(rows, row["loss_spans"]):
            assert row["input_ids"][:start] == sent[f"{sid}@turn{r['turn']}"]
            assert row["input_ids"][start:end] == r["output_ids"]
        mask = span_mask(row["length"], row["loss_spans"]).tolist()
        assert [t for t, m in zip(row["input_ids"], mask) if m] == sum(
            (r["output_ids"] for r in rows), []
        )
        outputs.update(t for r in rows for t in r["output_ids"])
    summary = report.summary.train
    assert (summary.samples, summary.turns) == (4, 8)
    assert summary.supervised_tokens == sum(outputs.values())
    counts = supervised_counts(tmp_path / "train.parquet", vocab_size=len(tok))
    assert {t: n for t, n in enumerate(counts.tolist()) if n} == dict(outputs)


@pytest.mark.integration
@pytest.mark.slow
def test_the_sglang_engine_is_sent_the_same_turns(reference, prompts, hf_engine, tmp_path):
    out, sent, _ = reference
    server = HFServer(hf_engine, eos_ids=model_eos_ids(hf_engine.model)).start()
    try:
        gen = dataclasses.replace(
            GEN,
            engine="sglang",
            sglang=SGLangParams(
                urls=[server.url], concurrency=2, backoff_s=0.001, backoff_max_s=0.01
            ),
        )
        generate_dataset("chat", prompts[0], tmp_path / "chat", gen, 10**6, TARGET)
    finally:
        server.stop()
    assert {body["rid"].rsplit("#", 1)[0]: body["input_ids"] for body in server.received} == sent
    assert same(turns_of(tmp_path / "chat")) == same(turns_of(out))


@pytest.mark.slow
def test_a_kill_mid_conversation_loses_and_duplicates_nothing(
    reference, prompts, hf_engine, tmp_path
):
    out = tmp_path / "chat"
    with pytest.raises(KeyboardInterrupt):
        generate_dataset(
            "chat", prompts[0], out, GEN, 10**6, TARGET, Recording(hf_engine, killed_after=5)
        )
    kept, planned = turns_of(out), {sid: len(rows) for sid, rows in turns_of(reference[0]).items()}
    assert sum(map(len, kept.values())) == 5
    assert any(0 < len(rows) < planned[sid] for sid, rows in kept.items())  # halfway
    engine = Recording(hf_engine)
    resumed = generate_dataset("chat", prompts[0], out, GEN, 10**6, TARGET, engine)
    assert resumed.new_turns == len(engine.sent) == 8 - 5 and resumed.turns == 8
    assert same(turns_of(out)) == same(turns_of(reference[0]))


@pytest.mark.slow
def test_the_budget_counts_every_turn_and_a_raised_one_finishes_the_conversations(
    reference, prompts, hf_engine, tmp_path
):
    out = tmp_path / "chat"
    first = generate_dataset("chat", prompts[0], out, GEN, 60, TARGET, hf_engine)
    stored = [r for rows in turns_of(out).values() for r in rows]
    assert first.budget_reached and len(stored) == first.turns < 8
    assert first.tokens == sum(r["completion_tokens"] for r in stored)
    raised = generate_dataset("chat", prompts[0], out, GEN, 10**6, TARGET, hf_engine)
    assert raised.new_turns == 8 - first.turns
    assert same(turns_of(out)) == same(turns_of(reference[0]))


def test_a_turn_over_the_prompt_limit_ends_the_conversation(
    reference, prompts, hf_engine, tmp_path
):
    full = same(turns_of(reference[0]))
    limit = min(len(rows[1]["prompt_ids"]) for rows in full.values() if len(rows) > 1) - 1
    fitting = {sid: rows[:1] for sid, rows in full.items() if rows[0]["prompt_len"] <= limit}
    src = prompts[0].with_suffix(".json")
    prep = dataclasses.replace(ALL_TURNS, path=str(src), max_prompt_tokens=limit)
    prepare("chat", prep, ExpectParams(), TARGET, tmp_path / "p.parquet", tmp_path / "r")
    metrics = generate_dataset(
        "chat", tmp_path / "p.parquet", tmp_path / "chat", GEN, 10**6, TARGET, hf_engine
    )
    assert same(turns_of(tmp_path / "chat")) == fitting
    assert metrics.stopped_at_prompt_limit == sum(len(full[sid]) > 1 for sid in fitting) >= 2


def test_a_conversation_over_max_length_ends_at_its_last_turn_that_fits(reference, tmp_path):
    out, _, _ = reference
    three = turns_of(out)["chat/three"]
    fits = len(three[1]["prompt_ids"]) + len(three[1]["output_ids"])
    report = merge([out], tmp_path, MergeParams(eval_fraction=0.0, max_length=fits))
    row = next(
        r
        for r in pq.read_table(tmp_path / "train.parquet").to_pylist()
        if r["sample_id"] == "chat/three"
    )
    assert row["input_ids"] == three[1]["prompt_ids"] + three[1]["output_ids"]
    assert len(row["loss_spans"]) == 2 and not row["truncated"]
    assert report.summary.train.shortened >= 1


def test_mixed_runs_fail_the_merge(reference, tmp_path):
    out, _, _ = reference
    table = read_raw(out).to_pylist()
    broken = [
        dict(r, prompt_ids=[r["prompt_ids"][0] + 1] + r["prompt_ids"][1:])
        if r["sample_id"] == "chat/two" and r["turn"] == 1
        else r
        for r in table
    ]
    write_raw(tmp_path / "raw", broken)
    with pytest.raises(StageError, match=r"chat/two turn 1"):
        merge([tmp_path / "raw"], tmp_path / "m", MergeParams(eval_fraction=0.0))


@pytest.mark.slow
@pytest.mark.shared("data/mt_bench/question.jsonl")
def test_mt_bench_regenerates_both_questions(tmp_path, hf_engine, tok, eot):
    source = SHARED / "data" / "mt_bench" / "question.jsonl"
    questions = {
        str(json.loads(line)["question_id"]): json.loads(line)["turns"]
        for line in source.read_text().splitlines()
    }
    runs, reports = {}, {}
    for mode in ("last_turn", "all_turns"):  # into one directory: the mode is in the fingerprint
        prep = PrepParams(
            format="mt_bench",
            path=str(source),
            max_samples=3,
            max_prompt_tokens=1024,
            regenerate=mode,
        )
        prepare(
            "mt",
            prep,
            ExpectParams(),
            TARGET,
            tmp_path / f"{mode}.parquet",
            tmp_path / f"{mode}.json",
        )
        reports[mode] = generate_dataset(
            "mt", tmp_path / f"{mode}.parquet", tmp_path / "mt", GEN, 10**6, TARGET, hf_engine
        )
        runs[mode] = turns_of(tmp_path / "mt")
    assert runs["last_turn"].keys() == runs["all_turns"].keys() and len(runs["last_turn"]) == 3
    assert reports["all_turns"].new_turns == reports["all_turns"].turns == 6
    for sid, (single,) in runs["last_turn"].items():
        first, second = runs["all_turns"][sid]
        q1, q2 = questions[sid.split("/")[1]]
        assert (
            single["prompt_ids"]
            == first["prompt_ids"]
            == render_prompt(tok, [{"role": "user", "content": q1}], None, {})
        )
        context = first["prompt_ids"] + closed(first["output_ids"], eot)
        assert second["prompt_ids"][: len(context)] == context
        assert second["prompt_ids"][len(context) :] == render_prompt(
            tok, [{"role": "user", "content": q2}], None, {}
        )


def test_prep_refuses_a_template_that_rewrites_earlier_turns(prompts, tmp_path):
    template = (ROOT / "demo" / "chat_template.jinja").read_text()
    dropping = template.replace(
        "{{ message.reasoning_content or '' }}",
        "{{ message.reasoning_content if loop.last else '' }}",
    )
    assert dropping != template
    (tmp_path / "t.jinja").write_text(dropping)
    target = dataclasses.replace(TARGET, chat_template=str(tmp_path / "t.jinja"))
    prep = dataclasses.replace(ALL_TURNS, path=str(prompts[0].with_suffix(".json")))
    with pytest.raises(StageError) as err:
        prepare("chat", prep, ExpectParams(), target, tmp_path / "p", tmp_path / "r")
    for needle in (
        "dataset chat: regenerate: all_turns",
        str(tmp_path / "t.jinja"),
        "does it drop earlier reasoning?",
        "'thought</think>",
        "regenerate: last_turn",
        "params: datasets.chat.prep.regenerate",
    ):
        assert needle in str(err.value)
    last = dataclasses.replace(prep, regenerate="last_turn")
    assert (
        prepare("chat", last, ExpectParams(), target, tmp_path / "p", tmp_path / "r")["turns"] == 4
    )
