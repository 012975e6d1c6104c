"""The whole pipeline through the report with real `dvc repro` on a temporary copy of the project
(tiny budgets), then what sharing a run looks like: the compact metrics DVC shows and diffs, a
local-folder remote, and a fresh clone that pulls the artifacts and has nothing to reproduce.
Hidden states (`cache: false`) are neither cached nor pushed."""

from __future__ import annotations

import hashlib
import json

import pytest
import yaml

from stages.reporting.summary import unit
from tests.project import copy_project, ran_stages, set_params, sh

pytestmark = [pytest.mark.timeout(1200), pytest.mark.slow, pytest.mark.integration]

STAGES = {
    "merge",
    "quality",
    "vocab",
    "extract",
    "train",
    "benchmark",
    "benchmark_dflash",
    "report",
}


def tiny(p: dict) -> None:
    for ds in p["datasets"].values():
        ds["prep"]["max_samples"] = 4
    p["generate"].update(batch_size=4, max_new_tokens=64)  # replies cut short: let them pass
    p["quality"].update(max_truncated=1.0, min_reasoning_closed=0.0, min_tool_call_share=0.0)
    p["merge"]["eval_fraction"] = 0.3
    p["train"].update(max_steps=6, eval_every=3, checkpoint_every=3, batch_size=2)
    p["benchmark"].update(max_prompts=1, max_new_tokens=16)


@pytest.fixture(scope="module")
def repo(tmp_path_factory, demo_target):
    repo = copy_project(tmp_path_factory.mktemp("project"), tiny)
    first = sh(["dvc", "repro"], repo)
    assert ran_stages(first.stdout) >= STAGES, first.stdout
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "first run"], repo)
    return repo


def is_figure(cell: str) -> bool:
    """A cell of `dvc metrics show`: a number, or "-" where its file has no such figure."""
    try:
        float(cell)
    except ValueError:
        return cell == "-"
    return True


def test_metrics_are_the_run_figures_and_the_live_training_ones(repo):
    """reports/metrics.json, a dozen figures with units, and DVCLive's last logged step of
    training (step, loss, replayed tau): nothing else widens `dvc metrics show`, and no column
    holds text."""
    shown = json.loads(sh(["dvc", "metrics", "show", "--json"], repo).stdout)
    (workspace,) = shown.values()  # keyed by revision: "" is the workspace
    files = workspace["data"]
    assert list(files) == ["dvclive/metrics.json", "reports/metrics.json"]
    live = files["dvclive/metrics.json"]["data"]
    assert set(live) == {"step", "train", "eval"}, live
    assert set(live["train"]) == {"loss"} and set(live["eval"]) == {"replayed_tau"}
    figures = files["reports/metrics.json"]["data"]
    assert 10 <= len(figures) <= 12 and all(unit(k) for k in figures), figures
    # every null figure says why, in the notes beside the file; DVC leaves the null out
    written = json.loads((repo / "reports" / "metrics.json").read_text())
    why = json.loads((repo / "reports" / "metrics_notes.json").read_text())["why_null"]
    assert {k for k, v in written.items() if v is None} == set(why) and not set(why) & set(figures)
    table = sh(["dvc", "metrics", "show"], repo).stdout.splitlines()
    # Path, one column per figure, and the live step, loss and replayed tau: 15 figures at most
    assert len(table[0].split()) <= 16, table[0]
    for row in table[1:]:
        assert all(map(is_figure, row.split()[1:])), row
    assert {"benchmark_tau_t0_tokens_per_step", "dflash_tau_t0_tokens_per_step"} <= set(
        table[0].split()
    )
    assert (repo / "reports" / "index.html").stat().st_size > 10_000
    assert (repo / "models" / "card" / "README.md").read_text().startswith("---\n")


def test_a_benchmark_change_reruns_benchmark_and_report_and_diffs_named_figures(repo):
    set_params(repo, lambda p: p["benchmark"].update(max_new_tokens=24))
    rerun = sh(["dvc", "repro"], repo)
    # both families' benchmarks read the shared benchmark keys
    ran = ran_stages(rerun.stdout)
    assert ran == {"check", "benchmark", "benchmark_dflash", "report"}, rerun.stdout
    diff = json.loads(sh(["dvc", "metrics", "diff", "--all", "--json"], repo).stdout)
    figures = diff["reports/metrics.json"]
    assert {"benchmark_tau_t0_tokens_per_step", "train_tokens_per_s"} <= set(figures)
    assert all(unit(k) for k in figures)
    assert figures["generated_samples"]["diff"] == 0
    text = sh(["dvc", "metrics", "diff", "--all"], repo).stdout
    assert "dflash_tau_t0_tokens_per_step" in text and "reasoning_closed_min_share" in text
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "longer benchmark"], repo)


def test_a_clone_pulls_from_a_remote_and_has_nothing_to_reproduce(repo, tmp_path):
    remote = tmp_path / "remote"
    sh(["dvc", "remote", "add", "-d", "shared", str(remote)], repo)
    sh(["git", "commit", "-qam", "remote"], repo)
    sh(["dvc", "push"], repo)

    # hidden states are cache: false: not in the cache, not in the remote, not in git
    shard = next((repo / "data" / "hidden").glob("shard-*.safetensors"))
    digest = hashlib.md5(shard.read_bytes()).hexdigest()
    stored = {p.parent.name + p.name for p in remote.rglob("*") if p.is_file()}
    assert stored and digest not in stored
    assert not sh(["git", "ls-files", "data/hidden"], repo).stdout
    merged = hashlib.md5((repo / "data" / "merged" / "train.parquet").read_bytes()).hexdigest()
    assert merged in stored  # cached outputs are pushed

    clone = tmp_path / "clone"
    sh(["git", "clone", "-q", str(repo), str(clone)], tmp_path)
    sh(["dvc", "pull"], clone)
    for path in ("data/merged/train.parquet", "data/vocab/d2t_t2d.safetensors"):
        assert (clone / path).read_bytes() == (repo / path).read_bytes()
    assert (clone / "models" / "drafter" / "model.safetensors").exists()
    assert (clone / "reports" / "index.html").exists()  # cache: false reports live in git
    assert not (clone / "data" / "hidden").exists()

    status = json.loads(sh(["dvc", "status", "--json"], clone).stdout)
    assert status == {  # all that differs: the hidden states, never pushed
        "extract": [{"changed outs": {"data/hidden": "deleted"}}],
        "train": [{"changed deps": {"data/hidden": "deleted"}}],
        "train_dflash": [{"changed deps": {"data/hidden": "deleted"}}],
    }, status
    again = sh(["dvc", "repro", "--allow-missing"], clone)
    assert ran_stages(again.stdout) == set(), again.stdout


# Outputs that record how long their stage took: a rerun writes other timings into them.
TIMINGS = {
    "reports/extract.json",
    "reports/train.json",
    "reports/benchmark.json",
    "reports/benchmark_dflash.json",
}


def lock_outs(repo, stage: str) -> dict[str, str]:
    entry = yaml.safe_load((repo / "dvc.lock").read_text())["stages"][stage]
    return {o["path"]: o.get("md5") or o.get("hash") for o in entry.get("outs", [])}


def test_a_stage_rerun_with_the_same_inputs_writes_the_same_outputs(repo):
    """`dvc repro -f -s <stage>` of each stage on a finished run: every output hashes as before
    (generate with nothing left to generate included; the reports that hold timings aside), so
    nothing downstream reruns."""
    names = sorted(yaml.safe_load((repo / "params.yaml").read_text())["datasets"])
    stages = ["check", f"prep@{names[0]}", f"generate@{names[0]}", "merge", "quality", "vocab"]
    stages += ["report", "extract", "train", "benchmark", "benchmark_dflash"]  # timings shown
    for stage in stages:
        before = lock_outs(repo, stage)
        sh(["dvc", "repro", "-f", "-s", stage], repo)
        after = lock_outs(repo, stage)
        changed = {p for p in before if before[p] != after.get(p) and p not in TIMINGS}
        assert not changed, f"{stage} rewrote {sorted(changed)}"
    status = json.loads(sh(["dvc", "status", "--json"], repo).stdout)
    changed = {d for entries in status.values() for e in entries for d in e.get("changed deps", {})}
    assert changed <= TIMINGS, status  # only the timings the reruns wrote
