"""DuckDB by hand (`eagle-pipeline query`, `python -m stages.commands.query`) over a small
synthetic run's raw data, and the console script's other commands."""

from __future__ import annotations

import csv
import io
import json
import shlex
import subprocess
import sys

import pytest
import typer

from stages.commands import console, query
from stages.merge import merge
from stages.params.merge import MergeParams
from stages.queries import QUERY_DIR
from stages.queries.session import catalog, description, is_view, open_session, parameters
from stages.reporting.text import text_table
from tests.conftest import ROOT
from tests.dflash.test_benchmark_stage import export_random_dflash
from tests.reportdata import write_run
from tests.stage_runner import run_stage


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A run's raw data and its merge, as the stages wrote them."""
    root = tmp_path_factory.mktemp("project")
    paths = write_run(root)
    raw_dirs = sorted(p for p in paths["raw-dir"].iterdir() if p.is_dir())
    merge(raw_dirs, root / "data" / "merged", MergeParams(eval_fraction=0.25))
    return root


def ask(project, monkeypatch, capsys, *args):
    monkeypatch.chdir(project)
    return run_stage(query.main, list(args), monkeypatch, capsys)


def test_every_question_says_what_it_asks():
    names = [n for n, _ in catalog()]
    assert "samples" not in names and "length_distribution" in names  # a view is no question
    assert is_view("samples")
    for path in QUERY_DIR.glob("*.sql"):
        assert description(path.stem), f"{path.name}: start it with a one-line -- comment"
    assert parameters("longest_replies") == ["limit"]


def test_list_questions(project, monkeypatch, capsys):
    code, out, _ = ask(project, monkeypatch, capsys)
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == len(catalog())
    assert any(
        line.startswith("reasoning_unclosed") and "never closed" in line and "[limit]" in line
        for line in lines
    )


def test_named_question_for_one_dataset(project, monkeypatch, capsys):
    code, out, _ = ask(project, monkeypatch, capsys, "length_distribution", "--dataset", "chat")
    assert code == 0, out
    header, rule, *rows, count = out.splitlines()
    assert header.split() == ["dataset", "measure", "n", "min", "p5", "p50", "p95", "max", "mean"]
    assert {r.split()[1] for r in rows} == {"answer", "completion", "prompt", "reasoning", "total"}
    assert all(r.split()[0] == "chat" for r in rows) and count == "(5 rows)"


def test_a_dataset_beyond_the_first_rows_is_answered(project, monkeypatch, capsys):
    """--dataset narrows the views over the Parquet parts before the question's LIMIT: `tools`
    sorts after `chat`, so filtering the answer would find none of its rows in the first."""
    args = ["reasoning_unclosed", "-p", "limit=1", "--json"]
    code, out, err = ask(project, monkeypatch, capsys, *args)
    assert code == 0 and [r["dataset"] for r in json.loads(out)] == ["chat"], err
    code, out, err = ask(project, monkeypatch, capsys, *args, "--dataset", "tools")
    assert code == 0 and [r["sample_id"] for r in json.loads(out)] == ["tools/6"], err
    sql = "SELECT count(*) AS turns FROM raw"
    code, out, _ = ask(project, monkeypatch, capsys, "--sql", sql, "--dataset", "tools", "--json")
    assert json.loads(out) == [{"turns": 8}]


def test_the_merge_plan_for_one_dataset_is_the_whole_plan_narrowed(project, monkeypatch, capsys):
    """The plan dedupes across datasets: it is built from all of them, then narrowed."""
    _, whole, _ = ask(project, monkeypatch, capsys, "merged_counts", "--json")
    _, narrowed, _ = ask(
        project, monkeypatch, capsys, "merged_counts", "--dataset", "tools", "--json"
    )
    tools = [r for r in json.loads(whole) if r["dataset"] == "tools"]
    assert tools and json.loads(narrowed) == tools


def test_unclosed_reasoning_and_longest_replies(project, monkeypatch, capsys):
    code, out, _ = ask(project, monkeypatch, capsys, "reasoning_unclosed", "--json")
    rows = json.loads(out)
    assert {(r["sample_id"], r["finish_reason"]) for r in rows} == {
        ("chat/6", "length"),
        ("tools/6", "length"),
    }
    code, out, _ = ask(project, monkeypatch, capsys, "longest_replies", "-p", "limit=3", "--csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert len(table) == 3
    lengths = [int(r["completion_tokens"]) for r in table]
    assert lengths == sorted(lengths, reverse=True)


def test_any_sql_with_views(project, monkeypatch, capsys):
    sql = "SELECT dataset, count(*) AS turns FROM raw GROUP BY ALL ORDER BY 1"
    code, out, _ = ask(project, monkeypatch, capsys, "--sql", sql, "--json")
    assert code == 0 and [r["turns"] for r in json.loads(out)] == [8, 8]
    code, _, err = ask(project, monkeypatch, capsys, "--sql", "SELECT * FROM hidden_index")
    views = "views defined: merged, raw, samples, raw_ids, budgets"
    assert code == 1 and "hidden_index" in err and views in err, err
    code, _, err = ask(project, monkeypatch, capsys, "no_such_question")
    assert code == 1 and "known: budget_used" in err


def test_session_views(tmp_path):
    con, views = open_session(budgets={"a": 5})
    assert views == ["budgets"]
    assert con.execute("SELECT * FROM budgets").fetchall() == [("a", 5)]


def test_text_table_aligns_and_counts():
    text = text_table(["name", "n", "ids"], [("a", 1, [1, 2, 3, 4, 5]), ("bb", 10.5, None)])
    assert text.splitlines() == [
        "name     n  ids",
        "----  ----  -------------------",
        "a        1  [1, 2, 3, 4, …] (5)",
        "bb    10.5  NULL",
        "(2 rows)",
    ]


def test_console_groups_the_hand_commands(capsys):
    names = {c.name or c.callback.__name__ for c in console.app.registered_commands}
    assert names == {"query", "report", "estimate", "launch-line"}
    assert (
        'eagle-pipeline = "stages.commands.console:main"' in (ROOT / "pyproject.toml").read_text()
    )


def test_report_command_takes_its_paths_from_dvc_yaml():
    args = console.stage_args(ROOT / "dvc.yaml", "report", "stages.report")
    assert args[:2] == ["--raw-dir", "data/raw"] and "--out" in args
    assert args[args.index("--metrics") + 1] == "reports/metrics.json"


def test_launch_line(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(ROOT)
    code, out, _ = run_stage(console.launch_line, [], monkeypatch, capsys)
    words = shlex.split(out)
    assert code == 0 and words[1:3] == ["-m", "sglang.launch_server"]
    assert words[words.index("--model-path") + 1] == "data/demo/target"
    (tmp_path / "config.json").write_text("{}")
    code, out, _ = run_stage(console.launch_line, ["--drafter", str(tmp_path)], monkeypatch, capsys)
    words = shlex.split(out)
    assert words[words.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert words[words.index("--speculative-num-steps") + 1] == "3"


def test_the_launch_line_of_a_dflash_export_serves_it_at_its_block_size(
    monkeypatch, capsys, tmp_path
):
    monkeypatch.chdir(ROOT)
    export_random_dflash(tmp_path, block_size=6)
    code, out, _ = run_stage(console.launch_line, ["--drafter", str(tmp_path)], monkeypatch, capsys)
    words = shlex.split(out)
    assert code == 0 and words[words.index("--speculative-algorithm") + 1] == "DFLASH"
    assert words[words.index("--speculative-num-draft-tokens") + 1] == "6"
    assert "--speculative-num-steps" not in words


def test_console_usage_errors_are_one_line(monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["eagle-pipeline", "no-such-command"])
    with pytest.raises(SystemExit) as done:
        console.main()
    assert done.value.code == 2
    assert capsys.readouterr().err.strip() == "error: No such command 'no-such-command'."


@pytest.mark.parametrize("name", [n for n, _ in catalog()])
def test_every_listed_question_answers_with_its_defaults(name, project, monkeypatch, capsys):
    code, out, err = ask(project, monkeypatch, capsys, name)
    assert code == 0, err
    assert out.strip().endswith(("rows)", "row)")), out


@pytest.mark.parametrize(
    "args, says",
    [
        (["longest_replies", "-p", "limt=3"], "--param limt: question longest_replies takes limit"),
        (["duplicates", "-p", "limit=3"], "question duplicates takes no parameters"),
        (["length_distribution", "--dataset", "nosuch"], "--dataset 'nosuch' is no dataset"),
        (["--sql", ""], "--sql is empty"),
        (["--sql", "   "], "--sql is empty"),
        (["no_such_question"], "no question 'no_such_question'; known: "),
        (["--sql", "SELEC 1"], "query: Parser Error"),
    ],
)
def test_a_mistake_by_hand_is_one_line(args, says, project, monkeypatch, capsys):
    code, out, err = ask(project, monkeypatch, capsys, *args)
    assert code != 0 and says in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_console_answers_help_without_loading_torch():
    """`eagle-pipeline --help` (and each command's) imports no engine: it answers at once."""
    code = (
        "import sys\n"
        "from stages.commands import console\n"
        "try:\n"
        "    console.app(['--help'], standalone_mode=False)\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'duckdb') if m in sys.modules)\n"
        "print('loaded:', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert "query" in proc.stdout and "launch-line" in proc.stdout, proc.stdout + proc.stderr
    assert "loaded: []" in proc.stdout, proc.stdout


def test_every_option_a_user_types_has_help():
    from typer.main import get_command

    from stages.commands import canary

    commands = dict(get_command(console.app).commands)
    single = typer.Typer()
    single.command()(canary.main)
    commands["canary"] = get_command(single)
    for name, command in commands.items():
        bare = [p.name for p in command.params if p.param_type_name == "option" and not p.help]
        assert not bare, f"{name}: options without help {bare}"


def test_launch_line_refuses_what_no_server_could_load(monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(ROOT)
    params = tmp_path / "params.yaml"
    params.write_text((ROOT / "params.yaml").read_text().replace("data/demo/target", "/no/model"))
    code, _, err = run_stage(console.launch_line, ["--params", str(params)], monkeypatch, capsys)
    assert code == 1 and "target.path: /no/model is no directory" in err, err
    code, _, err = run_stage(console.launch_line, ["--drafter", "/no/drafter"], monkeypatch, capsys)
    assert code == 1 and "--drafter /no/drafter: no config.json" in err, err
