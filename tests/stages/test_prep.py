import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from transformers import AutoTokenizer

from stages import prep
from tests.conftest import ROOT, STORIES, STORIES_REL
from tests.project import set_params
from tests.stage_runner import run_stage

TEMPLATE = "tests/fixtures/stories_chat_template.jinja"


def conversation(i: int, text: str | None = None) -> dict:
    return {
        "id": f"c{i}",
        "conversations": [
            {"from": "human", "value": text if text is not None else f"Tell a story about cat {i}"},
            {"from": "gpt", "value": "Once upon a time."},
        ],
    }


def project(
    tmp_path,
    rows: list,
    *,
    fmt: str = "sharegpt",
    prep_extra: dict | None = None,
    params_extra: dict | None = None,
    jsonl: bool = False,
):
    src = tmp_path / ("data.jsonl" if jsonl else "data.json")
    src.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows)
        if jsonl
        else json.dumps(rows)
    )
    params = {
        "target": {"path": str(STORIES), "chat_template": TEMPLATE},
        "datasets": {
            "chat": {
                "prep": {
                    "format": fmt,
                    "path": str(src),
                    "max_samples": 100,
                    "max_prompt_tokens": 40,
                    **(prep_extra or {}),
                },
                "expect": {"reasoning": False},
            }
        },
    }  # a base model
    params.update(params_extra or {})
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    return p


def run_prep(tmp_path, params, monkeypatch, capsys):
    return run_stage(
        prep.main,
        [
            "chat",
            "--params",
            params,
            "--out",
            tmp_path / "prompts" / "chat.parquet",
            "--report",
            tmp_path / "reports" / "chat.json",
        ],
        monkeypatch,
        capsys,
    )


@pytest.mark.shared(STORIES_REL)
def test_a_template_file_dvc_does_not_track_is_named(tmp_path, monkeypatch, capsys):
    """Params hold the template file's path only: one outside templates/ (and the target's
    directory) gets a warning that an edit of it reruns nothing; one in templates/ does not."""
    params = project(tmp_path, [conversation(0)])
    code, out, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 0, err
    assert f"[target] warning: target.chat_template {TEMPLATE} is outside templates/" in out, out
    (tmp_path / "templates").mkdir()
    shutil.copy(ROOT / TEMPLATE, tmp_path / "templates" / "chat.jinja")
    monkeypatch.chdir(tmp_path)
    set_params(tmp_path, lambda p: p["target"].update(chat_template="templates/chat.jinja"))
    code, out, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 0, err
    assert "warning" not in out, out


@pytest.mark.shared(STORIES_REL)
def test_prompts_are_the_chat_template_ids(tmp_path, monkeypatch, capsys):
    rows = [conversation(i) for i in range(12)]
    rows.append(conversation(99, "Tell a  story about CAT 3"))  # same normalised prompt as c3
    rows.append(conversation(98, "a very long request " * 30))  # over max_prompt_tokens
    code, out, err = run_prep(tmp_path, project(tmp_path, rows), monkeypatch, capsys)
    assert code == 0, err
    table = pq.read_table(tmp_path / "prompts" / "chat.parquet").to_pylist()
    report = json.loads((tmp_path / "reports" / "chat.json").read_text())
    assert (report["rows"], report["duplicate"], report["too_long"], report["kept"]) == (
        14,
        1,
        1,
        12,
    )
    tok = AutoTokenizer.from_pretrained(STORIES)
    tok.chat_template = Path(TEMPLATE).read_text()
    row = next(r for r in table if r["sample_id"] == "chat/c5")
    messages = json.loads(row["messages"])
    assert messages == [{"role": "user", "content": "Tell a story about cat 5"}]  # reply dropped
    expected = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert row["prompt_ids"] == expected and row["prompt_len"] == len(expected)
    assert row["dataset"] == "chat" and row["tools"] is None and row["reasoning_open"] is False


@pytest.mark.shared(STORIES_REL)
def test_max_samples_is_a_seeded_sample(tmp_path, monkeypatch, capsys):
    rows = [conversation(i) for i in range(30)]
    picks = []
    for seed in (0, 0, 1):
        params = project(tmp_path, rows, prep_extra={"max_samples": 10, "seed": seed})
        assert run_prep(tmp_path, params, monkeypatch, capsys)[0] == 0
        picks.append(
            pq.read_table(tmp_path / "prompts" / "chat.parquet").column("sample_id").to_pylist()
        )
    assert len(picks[0]) == 10 and picks[0] == picks[1] and picks[0] != picks[2]
    assert picks[0] != [f"chat/c{i}" for i in range(10)]


@pytest.mark.parametrize(
    "rows, fmt, needle",
    [
        (
            ['{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}', '{"id": "b", '],
            "sharegpt",
            "data.jsonl, line 2",
        ),
        (['{"id": "a"}'], "sharegpt", "data.jsonl, line 1"),
        (['{"id": "a", "conversations": []}'], "sharegpt", "data.jsonl, line 1"),
        (
            ['{"id": "a", "conversations": [{"from": "human", "value": "hi"}]}'],
            "alpaca",
            "unknown format",
        ),
    ],
)
@pytest.mark.shared(STORIES_REL)
def test_bad_rows_fail_naming_file_and_row(tmp_path, monkeypatch, capsys, rows, fmt, needle):
    code, _, err = run_prep(
        tmp_path, project(tmp_path, rows, fmt=fmt, jsonl=True), monkeypatch, capsys
    )
    assert code == 1 and needle in err, err
    assert not any((tmp_path / "prompts").glob("*"))  # nothing, not even a temp file, left


@pytest.mark.shared(STORIES_REL)
def test_skip_bad_rows_counts_them(tmp_path, monkeypatch, capsys):
    rows = [
        json.dumps(conversation(1)),
        "{broken",
        json.dumps({"id": "x"}),
        json.dumps(conversation(2)),
    ]
    params = project(tmp_path, rows, jsonl=True, prep_extra={"skip_bad_rows": True})
    code, _, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "reports" / "chat.json").read_text())
    assert report["malformed"] == 2 and report["kept"] == 2
    assert "line 2" in report["malformed_examples"][0]


@pytest.mark.parametrize(
    "edit, needle",
    [
        (
            {"max_sample": 3},
            "datasets.chat.prep.max_sample: unknown key; did you mean 'max_samples'?",
        ),
        ({"max_samples": "ten"}, "datasets.chat.prep.max_samples: expected int"),
    ],
)
def test_bad_params_fail_naming_the_key(tmp_path, monkeypatch, capsys, edit, needle):
    params = project(tmp_path, [conversation(1)], prep_extra=edit)
    code, _, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 1 and needle in err, err


@pytest.mark.shared(STORIES_REL)
def test_all_prompts_too_long_is_an_error(tmp_path, monkeypatch, capsys):
    params = project(tmp_path, [conversation(1, "word " * 100)])
    code, _, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 1 and "no usable prompt" in err and "too_long" in err, err


DEMO_TEMPLATE = (ROOT / "demo" / "chat_template.jinja").read_text()
NO_GENERATION_PROMPT = DEMO_TEMPLATE.split("{%- if add_generation_prompt -%}")[0]


@pytest.mark.parametrize(
    "target, expect, needles",
    [
        (
            {"template_kwargs": {"thinking": False}},
            True,
            [
                "ends with '<|im_assistant|>assistant<|im_middle|><think></think>'",
                "closes reasoning",
                "but reasoning is expected",
                "template kwargs (e.g. {thinking: true})",
                "params: target.template_kwargs, target.chat_template, "
                "datasets.chat.expect.reasoning",
            ],
        ),
        (
            {},
            False,
            [
                "ends with '<|im_assistant|>assistant<|im_middle|><think>'",
                "opens reasoning",
                "no reasoning is expected",
                "{thinking: false}",
                "params: datasets.chat.expect.reasoning, target.template_kwargs",
            ],
        ),
        (
            {"chat_template": "no_generation_prompt.jinja"},
            True,
            [
                "<|im_end|>'",
                "no_generation_prompt.jinja adds nothing for the reply",
                "the prompt must open the assistant's turn: fix the chat template",
                "params: target.chat_template",
            ],
        ),
    ],
)
def test_a_prompt_that_does_not_end_as_promised_fails_prep(
    tmp_path, monkeypatch, capsys, demo_target, target, expect, needles
):
    (tmp_path / "no_generation_prompt.jinja").write_text(NO_GENERATION_PROMPT)
    if "chat_template" in target:
        target = {"chat_template": str(tmp_path / target["chat_template"])}
    params = project(
        tmp_path, [conversation(1)], params_extra={"target": {"path": str(demo_target), **target}}
    )
    set_params(tmp_path, lambda p: p["datasets"]["chat"].update(expect={"reasoning": expect}))
    code, _, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 1 and "dataset chat: the generation prompt " in err, err
    assert all(needle in err for needle in needles), err
    assert not (tmp_path / "prompts" / "chat.parquet").exists()


def test_the_demo_template_opens_reasoning_as_the_demo_expects(
    tmp_path, monkeypatch, capsys, demo_target
):
    params = project(
        tmp_path, [conversation(1)], params_extra={"target": {"path": str(demo_target)}}
    )
    set_params(tmp_path, lambda p: p["datasets"]["chat"].update(expect={"reasoning": True}))
    code, _, err = run_prep(tmp_path, params, monkeypatch, capsys)
    assert code == 0, err
    assert pq.read_table(tmp_path / "prompts" / "chat.parquet").to_pylist()[0]["reasoning_open"]


KIMI_STYLE = ROOT / "tests" / "fixtures" / "kimi_k25_style.jinja"


def two_turns() -> dict:
    return {
        "id": "two",
        "conversations": [
            {"from": "human", "value": "Explain what causes the seasons."},
            {"from": "gpt", "value": "-"},
            {"from": "human", "value": "Explain what inflation is."},
        ],
    }


@pytest.mark.parametrize("mode", ["all_turns", "all_turns_rendered"])
def test_a_template_that_drops_earlier_reasoning_needs_the_rendered_mode(
    tmp_path, monkeypatch, capsys, demo_target, mode
):
    target = {"path": str(demo_target), "chat_template": str(KIMI_STYLE)}
    params = project(
        tmp_path,
        [two_turns()],
        prep_extra={"regenerate": mode, "max_prompt_tokens": 1024},
        params_extra={"target": target},
    )
    set_params(tmp_path, lambda p: p["datasets"]["chat"].update(expect={"reasoning": True}))
    code, _, err = run_prep(tmp_path, params, monkeypatch, capsys)
    if mode == "all_turns":  # the concatenated ids would keep reasoning the template drops
        assert code == 1, err
        for needle in (
            "dataset chat: regenerate: all_turns builds",
            "the first ids that differ",
            "(regenerate: all_turns_rendered)",
            "(regenerate: last_turn)",
            "params: datasets.chat.prep.regenerate, target.chat_template, target.template_kwargs",
        ):
            assert needle in err, err
        return
    assert code == 0, err
    (row,) = pq.read_table(tmp_path / "prompts" / "chat.parquet").to_pylist()
    assert row["turn_deltas"] == [] and len(row["turn_messages"]) == 2
    assert json.loads(row["turn_messages"][1]) == [
        {"role": "user", "content": "Explain what inflation is."}
    ]
    assert json.loads((tmp_path / "reports" / "chat.json").read_text())["turns"] == 2
