"""A run that trains EAGLE-3 alone (`extract.drafters: [eagle3]`), through the report with real
`dvc repro` on a temporary copy of the project: the DFlash stages run and say they trained
nothing, DVC records their empty outputs (a second repro has nothing to do), and the page, the
card and the metrics say DFlash was not trained, and why."""

from __future__ import annotations

import json

import pytest

from tests.pipeline.test_dvc_sharing import tiny
from tests.project import copy_project, ran_stages, sh

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow, pytest.mark.integration]


def eagle3_only(p: dict) -> None:
    tiny(p)
    p["extract"]["drafters"] = ["eagle3"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory, demo_target):
    repo = copy_project(tmp_path_factory.mktemp("project"), eagle3_only)
    first = sh(["dvc", "repro"], repo)
    assert {"train", "train_dflash", "benchmark_dflash", "report"} <= ran_stages(first.stdout)
    return repo


def test_the_dflash_stages_record_that_nothing_was_trained(repo):
    assert (repo / "models/dflash").is_dir() and not any((repo / "models/dflash").iterdir())
    assert json.loads((repo / "reports/train_dflash.json").read_text())["trained"] is False
    benchmark = json.loads((repo / "reports/benchmark_dflash.json").read_text())
    assert benchmark["trained"] is False and "extract.drafters" in benchmark["reason"]
    meta = json.loads((repo / "data/hidden/meta.json").read_text())
    assert list(meta["drafter_layers"]) == ["eagle3"]
    again = sh(["dvc", "repro"], repo)
    assert ran_stages(again.stdout) == set(), again.stdout


def test_the_report_says_dflash_was_not_trained(repo):
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    notes = json.loads((repo / "reports/metrics_notes.json").read_text())["why_null"]
    assert metrics["dflash_tau_t0_tokens_per_step"] is None
    assert metrics["benchmark_tau_t0_tokens_per_step"] > 1.0
    assert "not trained" in notes["dflash_tau_t0_tokens_per_step"]
    card = (repo / "models/card/README.md").read_text()
    assert "DFlash: not trained" in card and "DFLASH" not in card
    assert "DFlash: not trained" in (repo / "reports/index.html").read_text()
