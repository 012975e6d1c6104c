"""The report stage on a small synthetic run (tests/reportdata.py): the HTML page, the compact
metrics and the model card; and the library pieces under it (reply anatomy, charts, metrics)."""

from __future__ import annotations

import html
import json
import re
import shlex
from dataclasses import replace

import pytest
import yaml

from stages import report
from stages.reporting import svg
from stages.reporting.anatomy import decode_marked, split_reply
from stages.reporting.card import speculators_command
from stages.reporting.page import buckets
from stages.reporting.summary import UNITS, run_metrics, unit
from stages.reports.record import ReportError
from stages.target_model.tokens import TokenRoles
from tests.conftest import ROOT
from tests.reportdata import (
    BENCHMARK,
    DATASETS,
    DFLASH,
    DFLASH_NOT_TRAINED,
    ERROR,
    EXTRACT,
    MERGE,
    TRAIN,
    VOCAB,
    generate_report,
    write_run,
)

DETAILED = (  # the stages' detailed reports: plain outputs, kept in git, not metrics
    "reports/prep/${key}.json",
    "reports/generate/${key}.json",
    "reports/merge.json",
    "reports/quality.json",
    "reports/vocab.json",
    "reports/extract.json",
    "reports/train.json",
    "reports/benchmark.json",
    "reports/benchmark_dflash.json",
)

ROLES = TokenRoles(
    think=12,
    end_think=13,
    tool_call_begin=9,
    tool_call_end=11,
    tool_section_begin=7,
    tool_section_end=8,
    end_of_turn=2,
    eos=1,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    paths = write_run(root)
    report.main(**{k.replace("-", "_"): v for k, v in paths.items()}, params=root / "params.yaml")
    return paths


def test_split_reply_by_token_role():
    ids = [50, 51, 13, 60, 61, 7, 9, 70, 10, 71, 11, 8, 62, 2]
    parts = split_reply(ids, ROLES, reasoning_open=True)
    assert [(p.kind, p.ids) for p in parts] == [
        ("reasoning", [50, 51, 13]),
        ("answer", [60, 61]),
        ("tool_calls", [7, 9, 70, 10, 71, 11, 8]),
        ("answer", [62]),
        ("stop", [2]),
    ]
    assert sum((p.ids for p in parts), []) == ids


def test_split_reply_unclosed_reasoning_and_open_call():
    assert [p.kind for p in split_reply([50, 51, 52], ROLES, True)] == ["reasoning"]
    no_think = split_reply([60, 7, 9, 70], ROLES, reasoning_open=False)  # cut inside a call
    assert [(p.kind, p.ids) for p in no_think] == [("answer", [60]), ("tool_calls", [7, 9, 70])]
    written = split_reply([12, 50, 13, 60, 1], ROLES, reasoning_open=False)  # think written
    assert [(p.kind, p.ids) for p in written] == [
        ("reasoning", [12, 50, 13]),
        ("answer", [60]),
        ("stop", [1]),
    ]


def test_decode_marked_keeps_special_tokens_apart():
    words = {1: "a", 2: "b", 9: "<S>"}
    pieces = decode_marked([1, 2, 9, 1], lambda ids: "".join(words[i] for i in ids), {9})
    assert pieces == [("ab", False), ("<S>", True), ("a", False)]


def test_charts_are_inline_svg_with_marks():
    chart = svg.bars(["a", "b"], {"x": [1, 2], "y": [0.5, None]}, title="t", x_label="", y_label="")
    assert chart.startswith('<svg class="chart"') and chart.endswith("</svg>")
    assert chart.count('class="mark"') == 4 and "http" not in chart
    line = svg.lines({"loss": [(1, 3.0), (2, 2.0)]}, title="t", x_label="", y_label="")
    assert line.count('class="mark"') == 1
    assert svg.nice_ticks(0, 0.87) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]


# The charts' font as the page sets it (svg.chart, 11px) and the width of a character in it: the
# widest digits of common sans-serif fonts are about 0.6 em.
CHART_CHAR_PX = 0.6 * 11


def axis_labels(chart: str) -> list[tuple[float, str]]:
    """The category labels under a chart's x axis: (centre x, text), left to right."""
    found = re.findall(
        r'<text class="tick" x="([\d.]+)" y="\d+" text-anchor="middle">([^<]*)<', chart
    )
    return sorted((float(x), html.unescape(text)) for x, text in found)


def overlapping(labels: list[tuple[float, str]]) -> list[tuple[str, str]]:
    """Neighbouring labels (centred on x) that would touch at CHART_CHAR_PX a character."""
    return [
        (a, b)
        for (xa, a), (xb, b) in zip(labels, labels[1:])
        if xb - xa < (len(a) + len(b)) / 2 * CHART_CHAR_PX + 2
    ]


def test_histogram_labels_are_thinned_until_none_overlaps():
    """Ten buckets starting at five- and six-character numbers in a 340-pixel histogram: a label
    every other bucket, from the first."""
    starts = [svg.number(1000 + 1250 * k) for k in range(10)]  # "1,000" ... "12,250"
    chart = svg.bars(
        starts,
        {"replies": list(range(10))},
        title="t",
        x_label="",
        y_label="",
        width=340,
        scale=True,
    )
    labels = axis_labels(chart)
    assert [t for _, t in labels] == starts[::2]
    assert overlapping(labels) == []


def test_named_categories_widen_the_chart_until_every_name_fits():
    names = ["opencodeinstruct", "sharegpt_multiturn", "glaive_function_calling", "all"]
    labels = axis_labels(svg.bars(names, {"x": [1, 2, 3, 4]}, title="t", x_label="", y_label=""))
    assert [t for _, t in labels] == names and overlapping(labels) == []


def test_histogram_gaps_are_zero_buckets():
    rows = [
        {"bucket": 0, "bucket_start": 10, "samples": 2},
        {"bucket": 3, "bucket_start": 40, "samples": 1},
    ]
    assert [(r["bucket_start"], r["samples"]) for r in buckets(rows)] == [
        (10, 2),
        (20, 0),
        (30, 0),
        (40, 1),
    ]


def test_metrics_are_few_and_name_their_unit():
    """A dozen figures: with DVCLive's step, loss and replayed tau, `dvc metrics show` prints
    at most 15 columns."""
    m, notes = run_metrics(
        generate={"a": generate_report("a", 3, 30), "b": generate_report("b", 2, 10)},
        merge=MERGE,
        answers={
            "reasoning_presence": [
                {"dataset": "a", "reasoning_closed_share": 0.9},
                {"dataset": "b", "reasoning_closed_share": 0.5},
            ],
            "finish_reasons": [
                {"dataset": "a", "truncated_share": 0.1},
                {"dataset": "b", "truncated_share": 0.0},
            ],
            "tool_call_integrity": [
                {"dataset": "a", "tool_call_share": 0.2},
                {"dataset": "b", "tool_call_share": 0.7},
            ],
        },
        expect={"a": (True, False), "b": (False, True)},
        vocab=VOCAB,
        extract=replace(EXTRACT, extracted_tokens=0, tokens_per_s=0.0),  # nothing left
        train=TRAIN,
        benchmark=BENCHMARK,
        dflash=DFLASH,
    )
    assert m.figures() == {
        "generated_samples": 5,
        "generated_tokens": 40,
        "train_supervised_tokens": 801,
        "reasoning_closed_min_share": 0.9,  # b expects no reasoning
        "truncated_max_share": 0.1,
        "tool_call_min_share": 0.7,  # only b expects tool calls
        "vocab_coverage_share": 0.99,
        "replayed_tau_best_tokens_per_step": 2.4,
        "benchmark_tau_t0_tokens_per_step": 2.7,  # EAGLE-3's; T = 0.7 in the benchmark reports
        "dflash_tau_t0_tokens_per_step": 2.05,
        "extract_tokens_per_s": None,
        "train_tokens_per_s": 1000.0,
    }
    assert notes.why_null == {
        "extract_tokens_per_s": "not measured: this run extracted nothing (every shard was on "
        "disk already)"
    }
    assert all(unit(k) for k in m.figures()) and len(m.figures()) <= 12
    assert set(UNITS) >= {"_share", "_tokens_per_s"}


def test_report_page(run):
    html = run["out"].read_text()
    assert html.startswith("<!DOCTYPE html>")
    for name in DATASETS:
        assert f"<h3>{name}</h3>" in html
        for measure in ("prompt", "reasoning", "answer"):
            assert f'data-chart="hist-{name}-{measure}"' in html
    assert ERROR in html.replace("&quot;", '"')  # the failure, with its message
    # samples: the parts apart, special tokens marked where they sit
    for kind in ("reasoning", "answer", "tool_calls", "stop"):
        assert f'class="part {kind}"' in html
    assert '<span class="special">&lt;/think&gt;</span>' in html
    assert '<span class="special">&lt;|tool_call_begin|&gt;</span>' in html
    assert "functions.get_weather:0" in html
    for chart in ("train-loss", "train-tau", "train-acceptance", "benchmark-tau"):
        assert f'data-chart="{chart}"' in html
    assert "baseline 1.0" in html
    assert not re.search(r"""(?:src|href)=["']?https?:""", html)


def test_the_page_shows_both_drafters_side_by_side(run):
    """EAGLE-3's and DFlash's tau in one chart per dataset and temperature, each family's
    per-position acceptance, and each one's width: tokens verified per step."""
    page = html.unescape(run["out"].read_text().split('id="benchmark"')[1])
    for series in ("EAGLE-3, T = 0.0", "DFlash, T = 0.0", "EAGLE-3, T = 0.7", "DFlash, T = 0.7"):
        assert series in page
    for family in ("eagle-3", "dflash"):
        for kind in ("conditional", "unconditional"):
            assert f'data-chart="benchmark-{family}-{kind}"' in page
    assert "EAGLE-3: 4 tokens verified per step (chain of 3 drafts)" in page
    assert "DFlash: 4 tokens verified per step (block of 3 drafts)" in page
    cell = "<td[^>]*>[^<]*</td>"
    assert re.search(
        f"<tr><td[^>]*>DFlash</td>{cell}{cell}<td[^>]*>all</td>{cell}<td[^>]*>2.05<", page
    )


def test_no_chart_of_the_page_has_overlapping_labels(run):
    charts = re.findall(r'<svg class="chart".*?</svg>', run["out"].read_text(), re.S)
    assert len(charts) > 10
    for chart in charts:
        assert overlapping(axis_labels(chart)) == [], chart[:120]


def test_tile_captions_wrap_between_words_only(run):
    """A metrics key holds no space: its tile offers a line break after each underscore, and no
    rule of the page lets a browser break a word anywhere else."""
    page = run["out"].read_text()
    assert "break-all" not in page
    captions = re.findall(r'<div class="k">(.*?)<br>', page)
    keys = list(json.loads(run["metrics"].read_text()))
    assert [c.replace("<wbr>", "") for c in captions] == keys
    for caption in captions:
        assert all(piece.endswith("_") for piece in caption.split("<wbr>")[:-1]), caption
        assert "<wbr>" not in caption.replace("_<wbr>", ""), caption


def test_a_null_figure_shows_why_on_its_tile(run):
    why = json.loads(run["metrics-notes"].read_text())["why_null"]["extract_tokens_per_s"]
    tile = re.search(
        r'extract_<wbr>tokens_<wbr>per_<wbr>s<br>[^<]*</div><div class="why">([^<]*)</div>',
        run["out"].read_text(),
    )
    assert tile and html.unescape(tile.group(1)) == why


def test_the_page_serves_the_drafter_as_the_model_card_does(run):
    """Every command of the card's Serving section, the speculators conversion vLLM needs
    among them, is on the page."""
    page = html.unescape(run["out"].read_text().split('id="serving"')[1])
    card = run["card"].read_text().split("## Serving")[1]
    commands = re.findall(r"```bash\n(.*?)\n```", card, re.S)
    lines = [line for c in commands for line in c.splitlines()]
    assert len(lines) == 5 and any(line.startswith("speculators convert ") for line in lines)
    assert "--speculative-algorithm DFLASH" in lines[-1]  # the DFlash drafter instead
    for line in lines:
        assert line in page
    assert "vllm serve example-org/demo-target --speculative-config" in page
    assert f"{run['drafter-dir']}-speculators" in page


def test_metrics_file(run):
    m = json.loads(run["metrics"].read_text())
    assert m["generated_samples"] == 16 and m["truncated_max_share"] == 0.125
    assert (
        m["benchmark_tau_t0_tokens_per_step"] == 2.7 and m["dflash_tau_t0_tokens_per_step"] == 2.05
    )
    assert m["tool_call_min_share"] == 0.5  # 3 of the 6 tools replies that stopped call one
    assert all(unit(k) for k in m)


def test_the_metrics_file_holds_numbers_only(run):
    """DVC reads every value of a metrics file as a metric: a text would be a column of prose in
    `dvc metrics show`. Each leaf is a number, or null (which DVC leaves out)."""

    def leaves(value: object) -> list:
        if isinstance(value, dict):
            return [leaf for v in value.values() for leaf in leaves(v)]
        if isinstance(value, list):
            return [leaf for v in value for leaf in leaves(v)]
        return [value]

    found = leaves(json.loads(run["metrics"].read_text()))
    assert found and all(
        v is None or (isinstance(v, int | float) and not isinstance(v, bool)) for v in found
    ), found


def test_every_null_metric_says_why(run):
    """The extraction had nothing left to do: no extraction rate, and the notes beside the
    metrics file say so."""
    m = json.loads(run["metrics"].read_text())
    why = json.loads(run["metrics-notes"].read_text())["why_null"]
    nulls = {k for k, v in m.items() if v is None}
    assert nulls == set(why) == {"extract_tokens_per_s"}
    assert all(reason.startswith("not measured: ") for reason in why.values())
    assert "extracted nothing" in why["extract_tokens_per_s"]


def test_the_report_stage_refuses_a_report_with_a_renamed_key(tmp_path):
    """A key the train stage renamed (or a train.json of an older version) stops the report
    stage, naming the file and the key, before anything is written: no figure turns null."""
    paths = write_run(tmp_path)
    train = json.loads(paths["train-report"].read_text())
    train["best_tau"] = train.pop("best_replayed_tau")
    paths["train-report"].write_text(json.dumps(train))
    expected = (
        f'{paths["train-report"]}: key "best_replayed_tau" is missing (the file has "best_tau"'
    )
    with pytest.raises(ReportError, match=re.escape(expected)):
        report.main(
            **{k.replace("-", "_"): v for k, v in paths.items()}, params=tmp_path / "params.yaml"
        )
    assert not paths["metrics"].exists() and not paths["out"].exists()
    assert not paths["metrics-notes"].exists()


def test_model_card(run):
    text = run["card"].read_text()
    front, body = text.split("---\n")[1:3]
    meta = yaml.safe_load(front)
    assert meta["base_model"] == "example-org/demo-target"
    assert meta["license"] == "apache-2.0" and "eagle3" in meta["tags"]
    assert "| chat | 6 | 900 | 400 |" in body  # the data mix with token counts
    assert "[1, 3, 4]" in body and "[2, 4, 5]" in body  # SGLang's and vLLM's layer ids
    # tau per dataset, EAGLE-3 beside DFlash at each temperature, each at its verify width
    assert (
        "| EAGLE-3 (4/step), T = 0.0 | DFlash (4/step), T = 0.0 | EAGLE-3 (4/step), T = 0.7 |"
        in body
    )
    assert "| tools | 3.10 | 2.30 | 2.60 | 1.90 |" in body
    assert "--speculative-algorithm EAGLE3" in body
    assert (
        "python -m sglang.launch_server --model-path example-org/demo-target "
        f"--speculative-algorithm DFLASH --speculative-draft-model-path {run['dflash-dir']} "
        "--speculative-num-draft-tokens 4"
    ) in body
    assert "vllm serve example-org/demo-target --speculative-config" in body
    assert '"method": "eagle3"' in body
    # the speculators conversion carries the export's vLLM ids (its converter drops them otherwise)
    (convert,) = [line for line in body.splitlines() if line.startswith("speculators convert ")]
    assert convert.endswith(
        """--algorithm-kwargs '{"eagle_aux_hidden_state_layer_ids": [2, 4, 5]}'"""
    )
    assert f"--output-path {run['drafter-dir']}-speculators" in convert


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory):
    """The same run with no DFlash drafter trained: benchmark_dflash wrote NotTrained."""
    root = tmp_path_factory.mktemp("untrained_run")
    paths = write_run(root, dflash=DFLASH_NOT_TRAINED)
    report.main(**{k.replace("-", "_"): v for k, v in paths.items()}, params=root / "params.yaml")
    return paths


NOT_TRAINED_LINE = f"DFlash: not trained ({DFLASH_NOT_TRAINED.reason})"


def test_the_page_says_dflash_was_not_trained_and_draws_only_eagle3(untrained_run):
    """The reason where DFlash's figures would be; EAGLE-3's charts and rows alone, and no
    DFlash launch line among the commands."""
    page = html.unescape(untrained_run["out"].read_text())
    benchmark = page.split('id="benchmark"')[1].split('id="serving"')[0]
    assert f"<p>{NOT_TRAINED_LINE}</p>" in benchmark
    assert "tau per dataset, EAGLE-3 and DFlash" not in benchmark
    assert "tau per dataset, EAGLE-3, against plain decoding" in benchmark
    assert "EAGLE-3, T = 0.0" in benchmark and "DFlash, T = 0.0" not in benchmark
    for kind in ("conditional", "unconditional"):
        assert f'data-chart="benchmark-eagle-3-{kind}"' in benchmark
        assert f'data-chart="benchmark-dflash-{kind}"' not in benchmark
    assert not re.search(r"<td[^>]*>DFlash</td>", benchmark)
    assert "--speculative-algorithm EAGLE3" in page
    assert "DFLASH" not in page and "the DFlash drafter instead" not in page


def test_the_card_says_dflash_was_not_trained_and_gives_no_dflash_launch(untrained_run):
    text = untrained_run["card"].read_text()
    acceptance = text.split("## Acceptance length (tau)")[1].split("## Training")[0]
    assert f"{NOT_TRAINED_LINE}." in acceptance
    assert "| dataset | EAGLE-3 (4/step), T = 0.0 | EAGLE-3 (4/step), T = 0.7 |" in acceptance
    assert "| tools | 3.10 | 2.60 |" in acceptance
    assert "DFlash (" not in acceptance
    serving = text.split("## Serving")[1]
    assert len(re.findall(r"```bash\n", serving)) == 3  # SGLang, vLLM, vLLM via speculators
    assert "--speculative-algorithm EAGLE3" in serving
    assert "DFLASH" not in text and "the DFlash drafter instead" not in serving


def test_a_dflash_drafter_not_trained_leaves_its_tau_null_with_the_reason(untrained_run):
    metrics = json.loads(untrained_run["metrics"].read_text())
    why = json.loads(untrained_run["metrics-notes"].read_text())["why_null"]
    assert metrics["dflash_tau_t0_tokens_per_step"] is None
    assert metrics["benchmark_tau_t0_tokens_per_step"] == 2.7
    assert why["dflash_tau_t0_tokens_per_step"] == f"not measured: {NOT_TRAINED_LINE}"
    assert {k for k, v in metrics.items() if v is None} == set(why)
    tile = re.search(
        r"dflash_<wbr>tau_<wbr>t0_<wbr>tokens_<wbr>per_<wbr>step<br>[^<]*</div>"
        r'<div class="why">([^<]*)</div>',
        untrained_run["out"].read_text(),
    )
    assert tile and html.unescape(tile.group(1)) == why["dflash_tau_t0_tokens_per_step"]


def test_speculators_command_parses_as_speculators_reads_it():
    """speculators 0.9.0 (speculators/cli/convert.py `convert`): MODEL, --verifier, --algorithm,
    --output-path, and --algorithm-kwargs parsed by json.loads into Eagle3Converter's kwargs."""
    args = shlex.split(speculators_command("org/target", "models/drafter", [2, 30, 58]))
    assert args[:3] == ["speculators", "convert", "models/drafter"]
    opts = dict(zip(args[3::2], args[4::2], strict=True))
    assert opts["--algorithm"] == "eagle3" and opts["--verifier"] == "org/target"
    assert opts["--output-path"] == "models/drafter-speculators"
    assert json.loads(opts["--algorithm-kwargs"]) == {
        "eagle_aux_hidden_state_layer_ids": [2, 30, 58]
    }


def test_dvc_yaml_declares_the_run_metrics_file_and_the_live_training_one():
    """reports/metrics.json, the run's figures, and train's DVCLive figures (what `dvc exp show`
    shows of a run in progress); no other report is a metrics file, the notes on the figures
    included."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    bodies = {name: spec.get("do", spec) for name, spec in stages.items()}

    def named(entries: list) -> dict:
        return {next(iter(e)) if isinstance(e, dict) else e: e for e in entries}

    metrics = [m for body in bodies.values() for m in named(body.get("metrics", []))]
    assert metrics == ["dvclive/metrics.json", "reports/metrics.json"]
    assert "dvclive/metrics.json" in named(bodies["train"]["metrics"])
    outs = {path: e for body in bodies.values() for path, e in named(body.get("outs", [])).items()}
    for path in DETAILED:
        assert outs[path] == {path: {"cache": False, "persist": True}}, path  # plain outputs
    notes = "reports/metrics_notes.json"  # text: an output of the report stage, no metric
    assert outs[notes] == {notes: {"cache": False}}
    deps = bodies["report"]["deps"]
    assert {"reports/benchmark.json", "reports/train.json", "models/drafter"} <= set(deps)
    assert "models/card/README.md" in named(bodies["report"]["outs"])
