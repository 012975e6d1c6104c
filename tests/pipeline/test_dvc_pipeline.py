"""The DVC behaviours users rely on, shown with real `dvc repro` on a temporary copy of the
project, up to merge and the quality gate, with a small budget of prompts."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from tests.engines.conftest import free_port
from tests.project import ROOT, copy_project, ran_stages, set_params, sh
from tests.readme_text import as_run_here, readme_command, readme_commands

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow, pytest.mark.integration]


def last_dataset(params: dict) -> str:
    return sorted(params["datasets"])[-1]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, demo_target):
    def small(p):
        for ds in p["datasets"].values():
            ds["prep"]["max_samples"] = 6
        p["generate"]["batch_size"] = 2
        p["datasets"][last_dataset(p)]["generate"]["budget_tokens"] = 1  # stops after a batch

    return copy_project(tmp_path_factory.mktemp("project"), small)


def test_repro_noop_budget_change_and_metrics_diff(repo):
    first = sh(["dvc", "repro", "merge", "quality"], repo)
    names = yaml.safe_load((repo / "params.yaml").read_text())["datasets"]
    assert ran_stages(first.stdout) == (
        {"check"}
        | {f"prep@{n}" for n in names}
        | {f"generate@{n}" for n in names}
        | {"merge", "quality"}
    )
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "first run"], repo)

    again = sh(["dvc", "repro", "merge", "quality"], repo)
    assert ran_stages(again.stdout) == set(), again.stdout

    one = last_dataset({"datasets": names})
    before = json.loads((repo / "reports" / "generate" / f"{one}.json").read_text())
    assert before["samples"] == 2 and before["budget_reached"]
    set_params(repo, lambda p: p["datasets"][one]["generate"].update(budget_tokens=10**6))
    raised = sh(["dvc", "repro", "merge", "quality"], repo)
    assert ran_stages(raised.stdout) == {"check", f"generate@{one}", "merge", "quality"}
    after = json.loads((repo / "reports" / "generate" / f"{one}.json").read_text())
    assert after["new_samples"] == 4 and after["samples"] == 6  # resumed, nothing redone

    # the detailed reports are plain outputs now (reports/metrics.json is THE metrics file,
    # written by the report stage, which this run does not reach); DVC diffs them when named
    shown = json.loads(sh(["dvc", "metrics", "show", "--json"], repo).stdout)
    assert not any("generate" in path for rev in shown.values() for path in rev.get("data", {}))
    report = f"reports/generate/{one}.json"
    diff = json.loads(sh(["dvc", "metrics", "diff", "--json", "--targets", report], repo).stdout)
    assert diff[report]["samples"] == {"old": 2, "new": 6, "diff": 4}


def test_settings_that_shape_no_output_rerun_nothing_and_code_deps_do(repo):
    """Leaf params: a timeout, the append interval, a batch size or the engine's servers do not
    rerun generate (with `launch` that would start a server per dataset to find nothing to do),
    nor the merge's memory limit and threads; a change to a module a stage imports reruns
    that stage."""
    sh(["dvc", "repro", "merge", "quality"], repo)
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "run", "--allow-empty"], repo)

    def transport(p):
        p["generate"]["sglang"].update(timeout_s=7, max_retries=1, urls=["http://127.0.0.1:9"])
        p["generate"].update(append_every=5, batch_size=3)
        p["target"].update(device="cpu", cpu_threads=2)
        p["merge"].update(memory_limit_gb=3, threads=1)

    set_params(repo, transport)  # the params check reruns and passes: nothing else does
    assert ran_stages(sh(["dvc", "repro", "merge", "quality"], repo).stdout) == {"check"}

    tokens = repo / "stages" / "target_model" / "tokens.py"
    tokens.write_text(tokens.read_text() + "\n# a change to the token roles' module\n")
    status = sh(["dvc", "status", "--json"], repo).stdout
    changed = set(json.loads(status))
    names = yaml.safe_load((repo / "params.yaml").read_text())["datasets"]
    assert {f"prep@{n}" for n in names} | {f"generate@{n}" for n in names} <= changed, changed
    assert not {"merge", "quality"} & changed, changed  # they ran, and do not import it


def test_an_edit_to_a_chat_template_in_templates_reruns_the_stages_that_render_prompts(repo):
    """Params name the template file only by its path; the folder it is kept in is a dep of
    prep and generate, so an edit of the file itself (here a Jinja comment) reruns them."""
    template = repo / "templates" / "chat.jinja"
    template.write_text((ROOT / "demo" / "chat_template.jinja").read_text())
    set_params(repo, lambda p: p["target"].update(chat_template="templates/chat.jinja"))
    sh(["dvc", "repro", "merge", "quality"], repo)
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "with a template file"], repo)
    status = ["dvc", "status", "--json", "--with-deps", "merge", "quality"]
    assert json.loads(sh(status, repo).stdout) == {}

    template.write_text(template.read_text() + "{# edited #}\n")
    changed = set(json.loads(sh(status, repo).stdout))
    names = yaml.safe_load((repo / "params.yaml").read_text())["datasets"]
    assert {f"prep@{n}" for n in names} | {f"generate@{n}" for n in names} <= changed, changed
    assert not {"merge", "quality"} & changed, changed


def test_under_a_server_engine_a_target_dtype_edit_reruns_generate_as_a_no_op(tmp_path):
    """generate under `engine: sglang` (a server the stage launches from params): an edit of
    target.dtype, which only the hf engine reads, reruns generate, which finds every turn there
    under the server's facts, starts no server and leaves data/raw and its report as they were."""
    port = free_port()

    def served(p):
        p["datasets"] = {"sharegpt": p["datasets"]["sharegpt"]}
        p["datasets"]["sharegpt"]["prep"]["max_samples"] = 3
        p["generate"]["max_new_tokens"] = 8
        p["generate"]["engine"] = "sglang"
        p["generate"]["sglang"]["launch"] = dict(
            module="tests.doubles.hf_server",
            server_args=dict(port=port, max_running_requests=4),
            health_timeout_s=120,
        )

    repo = copy_project(tmp_path / "repo", served)
    first = sh(["dvc", "repro", "generate@sharegpt"], repo)
    assert "generate@sharegpt" in ran_stages(first.stdout)
    before = contents(repo / "data", repo / "reports/generate")
    set_params(repo, lambda p: p["target"].update(dtype="bfloat16"))
    again = sh(["dvc", "repro", "generate@sharegpt"], repo)
    assert ran_stages(again.stdout) == {"check", "generate@sharegpt"}, again.stdout
    assert "nothing left to generate: no engine started" in again.stdout
    assert contents(repo / "data", repo / "reports/generate") == before


def contents(*roots):
    """Every file under `roots`, by path: its bytes."""
    return {
        str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_an_extraction_run_by_hand_is_recorded_by_the_readmes_commit_line(repo):
    """Step 7 on a node: the extraction runs under torchrun, outside DVC; the README's `dvc
    commit` line (run as written, with no terminal to answer a question) records it, and the
    pipeline is up to date after it."""
    sh(["dvc", "repro", "merge", "quality"], repo)
    line = readme_command("torchrun --standalone --nproc-per-node 8 -m stages.extract")
    sh(as_run_here(line, "<target>", 1), repo)
    assert "extract" in json.loads(sh(["dvc", "status", "--json", "extract"], repo).stdout)
    commit = next(c for c in readme_commands() if c.startswith("dvc commit") and "extract" in c)
    sh(shlex.split(commit), repo)  # stdin no terminal, as in a script
    assert json.loads(sh(["dvc", "status", "--json", "extract"], repo).stdout) == {}
