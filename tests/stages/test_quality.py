import pytest

from stages.params.datasets import ExpectParams
from stages.params.quality import QualityParams
from stages.quality import HISTOGRAM_COLUMNS, answer, gate, markdown, metrics
from stages.reports.prep import PrepReport
from stages.runtime.files import write_csv
from tests.rawdata import raw_row, write_raw

EXPECT = {"chat": ExpectParams(reasoning=True), "fc": ExpectParams(reasoning=True, tool_calls=True)}
BUDGETS = {"chat": 1000, "fc": 200}


def run_questions(tmp_path, chat_rows, fc_rows):
    write_raw(tmp_path / "chat", chat_rows)
    write_raw(tmp_path / "fc", fc_rows)
    return answer({"chat": tmp_path / "chat", "fc": tmp_path / "fc"}, BUDGETS, buckets=4)


def healthy(tmp_path):
    chat = [raw_row("chat", i, output_len=20 + i, reasoning=5 + i % 3) for i in range(20)]
    fc = [raw_row("fc", i, tool_calls=1, tools=True) for i in range(10)]
    return run_questions(tmp_path, chat, fc)


def by(rows, dataset, **match):
    return next(
        r for r in rows if r["dataset"] == dataset and all(r[k] == v for k, v in match.items())
    )


def test_answers_on_healthy_data(tmp_path):
    ans = healthy(tmp_path)
    chat_total = by(ans["length_distribution"], "chat", measure="completion")
    assert (chat_total["min"], chat_total["max"], chat_total["n"]) == (20, 39, 20)
    assert chat_total["p5"] <= chat_total["p50"] <= chat_total["p95"]
    assert by(ans["reasoning_presence"], "chat")["reasoning_closed_share"] == 1.0
    assert by(ans["tool_call_integrity"], "fc")["tool_call_share"] == 1.0
    budget = by(ans["budget_used"], "fc")
    assert budget["generated_tokens"] == 60 and budget["budget_used_share"] == pytest.approx(0.3)
    hist = [
        r for r in ans["length_histogram"] if r["dataset"] == "chat" and r["measure"] == "total"
    ]
    assert sum(r["samples"] for r in hist) == 20 and len(hist) <= 4
    assert gate(ans, EXPECT, QualityParams()) == []
    write_csv(ans["length_histogram"], tmp_path / "lengths.csv", HISTOGRAM_COLUMNS)
    assert "bucket_start" in (tmp_path / "lengths.csv").read_text().splitlines()[0]


def test_gate_catches_lost_reasoning(tmp_path):
    # the seeds' bug: the answer arrives, the reasoning and its </think> do not
    chat = [raw_row("chat", i, reasoning=None) for i in range(20)]
    fc = [raw_row("fc", i, tool_calls=1, tools=True) for i in range(10)]
    failures = gate(run_questions(tmp_path, chat, fc), EXPECT, QualityParams())
    assert failures == [
        "dataset chat: reasoning closed in 0.0% (minimum 90%, quality.min_reasoning_closed)"
    ]


def test_gate_catches_truncation_failures_and_broken_tool_calls(tmp_path):
    chat = [raw_row("chat", i, finish="length" if i < 5 else "stop") for i in range(20)]
    fc = (
        [raw_row("fc", i, tools=True) for i in range(6)]
        + [raw_row("fc", 10 + i, tool_calls=1, balanced=i > 0, tools=True) for i in range(3)]
        + [raw_row("fc", 20, finish="abort", tools=True)]
    )
    failures = gate(run_questions(tmp_path, chat, fc), EXPECT, QualityParams())
    text = "\n".join(failures)
    assert "dataset chat: truncated (finish_reason=length) 25.0% (maximum 10%" in text
    assert "dataset fc: failed generations 10.0% (maximum 5%, quality.max_failed)" in text
    assert "dataset fc: tool calls left open in 11.1%" in text
    assert "dataset fc: replies calling a tool 33.3% (minimum 50%" in text


def test_gate_reports_missing_dataset(tmp_path):
    ans = healthy(tmp_path)
    failures = gate(ans, {**EXPECT, "ghost": ExpectParams()}, QualityParams())
    assert failures == ["dataset ghost: no generated samples"]


def prep_report(dataset: str, rows: int, duplicate: int, too_long: int) -> PrepReport:
    kept = rows - duplicate - too_long
    return PrepReport(dataset, rows, 0, duplicate, too_long, 0, kept, kept, [])


def test_metrics_and_markdown(tmp_path):
    ans = healthy(tmp_path)
    prep = {"chat": prep_report("chat", 25, 3, 2), "fc": prep_report("fc", 10, 0, 0)}
    m = metrics(ans, prep, [])
    assert m.gate_passed is True
    assert m.datasets["chat"].too_long == 2 and m.datasets["fc"].tool_call_share == 1.0
    assert m.datasets["fc"].generated_tokens == 60
    m.write(tmp_path / "quality.json")  # every column of the questions has its field
    md = markdown(ans, prep, ["dataset chat: x"])
    assert "Gate: **FAILED**" in md and "- dataset chat: x" in md and "| chat | 25 | 20 | 3 |" in md


def test_turns_are_counted_per_reply_and_duplicates_per_sample(tmp_path):
    chat = [raw_row("chat", i) for i in range(4)]
    chat += [dict(raw_row("chat", i), turn=2, prompt_len=20) for i in range(2)]
    fc = [raw_row("fc", i, tool_calls=1, tools=True) for i in range(3)]
    ans = run_questions(tmp_path, chat, fc)
    assert by(ans["turns_per_sample"], "chat") == {
        "dataset": "chat",
        "turns": 6,
        "turns_per_sample": 1.5,
        "max_turns": 2,
    }
    assert by(ans["duplicates"], "chat") == {"dataset": "chat", "samples": 4, "duplicates": 0}
    assert by(ans["finish_reasons"], "chat")["samples"] == 6
    assert by(ans["length_distribution"], "chat", measure="prompt")["max"] == 20
