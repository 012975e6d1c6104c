"""The DVC behaviours users rely on, shown with real `dvc repro` on a temporary copy of the
project, up to merge and the quality gate, with a small budget of prompts."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.project import copy_project, ran_stages, set_params, sh

pytestmark = pytest.mark.timeout(900)


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
    assert ran_stages(first.stdout) == ({f"prep@{n}" for n in names}
                                        | {f"generate@{n}" for n in names} | {"merge", "quality"})
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "first run"], repo)

    again = sh(["dvc", "repro", "merge", "quality"], repo)
    assert ran_stages(again.stdout) == set(), again.stdout

    one = last_dataset({"datasets": names})
    before = json.loads((repo / "reports" / "generate" / f"{one}.json").read_text())
    assert before["samples"] == 2 and before["budget_reached"]
    set_params(repo, lambda p: p["datasets"][one]["generate"].update(budget_tokens=10**6))
    raised = sh(["dvc", "repro", "merge", "quality"], repo)
    assert ran_stages(raised.stdout) == {f"generate@{one}", "merge", "quality"}
    after = json.loads((repo / "reports" / "generate" / f"{one}.json").read_text())
    assert after["new_samples"] == 4 and after["samples"] == 6  # resumed, nothing redone

    diff = json.loads(sh(["dvc", "metrics", "diff", "--json"], repo).stdout)
    assert diff[f"reports/generate/{one}.json"]["samples"] == {"old": 2, "new": 6, "diff": 4}
