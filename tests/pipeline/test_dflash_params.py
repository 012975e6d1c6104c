"""An edit of a `dflash` key reruns the DFlash stage and not EAGLE-3's train, and an edit of a
`train` key the reverse; a `dflash` key that moves the layers DFlash reads (or a change of the
families trained) reruns extract too, which captures them: real `dvc status` on a temporary copy
of the project whose extract and training stages are recorded as done (`dvc commit` over
stand-in inputs and outputs)."""

from __future__ import annotations

import json

import pytest

from tests.project import copy_project, set_params, sh

pytestmark = [pytest.mark.timeout(300), pytest.mark.integration]

STAGES = ("extract", "train", "train_dflash")
# what the stages read and write, as stand-ins: `dvc commit` records their hashes
FILES = (
    "data/merged/train.parquet",
    "reports/quality.json",
    "reports/extract.json",
    "data/hidden/meta.json",
    "data/vocab/d2t_t2d.safetensors",
    "models/checkpoints/last.pt",
    "models/drafter/config.json",
    "reports/train.json",
    "dvclive/metrics.json",
    "dvclive/plots/metrics/train/loss.tsv",
    "reports/plots/train_loss.csv",
    "reports/plots/train_evals.csv",
    "reports/plots/train_acceptance.csv",
    "models/dflash_checkpoints/last.pt",
    "models/dflash/config.json",
    "reports/train_dflash.json",
    "reports/plots/train_dflash_loss.csv",
    "reports/plots/train_dflash_evals.csv",
    "reports/plots/train_dflash_accuracy.csv",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = copy_project(tmp_path_factory.mktemp("project"))
    for rel in FILES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(f"{rel}\n")
    sh(["dvc", "commit", "-f", *STAGES], repo)
    return repo


def changed(repo) -> dict[str, list]:
    """The stages `dvc status` finds changed, with what changed."""
    out = sh(["dvc", "status", "--json", *STAGES], repo).stdout
    return json.loads(out or "{}")


@pytest.mark.parametrize(
    "section, key, value, reruns",
    [
        ("dflash", "block_size", 4, ["train_dflash"]),
        ("train", "lr", 0.01, ["train"]),
        ("dflash", "num_layers", 2, ["extract", "train_dflash"]),
        ("dflash", "target_layer_ids", [1, 4], ["extract", "train_dflash"]),
        ("extract", "drafters", ["eagle3"], ["extract"]),
    ],
)
def test_an_edit_reruns_only_the_stages_it_shapes(repo, section, key, value, reruns):
    assert changed(repo) == {}
    set_params(repo, lambda p: p[section].update({key: value}))
    try:
        status = changed(repo)
    finally:
        sh(["git", "checkout", "-q", "params.yaml"], repo)
    assert sorted(status) == reruns, status
    for stage in reruns:
        assert f"{section}.{key}" in json.dumps(status[stage]), status
