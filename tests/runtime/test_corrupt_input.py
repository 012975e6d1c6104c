"""Input an earlier run left damaged (a machine crash, a disk fault: not a process kill): a raw
part or a shard truncated or bit-flipped after it was written is found by its recorded size and
sha256 before it is used. generate and extract make it again; merge, quality and train refuse,
naming the file. A dvc repro over raw data of another fingerprint regenerates, saying why."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from stages import extract, generate, merge, quality, train
from stages.artifacts.raw import read_raw
from stages.runtime import files
from stages.runtime.outputs import remove_stale_temps
from tests.project import copy_project, ran_stages, sh
from tests.reliability import (
    demo_params,
    extract_args,
    extracted_run,
    generate_args,
    generated_run,
    leftovers,
    merge_args,
    outputs,
    quality_args,
    shared_run,
    train_args,
)
from tests.stage_runner import run_stage


def flip_bit(path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0x10
    path.write_bytes(bytes(data))


def truncate(path) -> None:
    os.truncate(path, path.stat().st_size * 2 // 3)


DAMAGE = {
    "bit-flipped": (flip_bit, "its sha256 differs from the one recorded when it was written"),
    "truncated": (truncate, "were written (truncated or cut off by a crash)"),
    "checksum lost": (
        lambda p: files.checksum_path(p).unlink(),
        "no checksum recorded (",
    ),
}


def test_checksums_find_truncation_and_bit_flips(tmp_path):
    path = tmp_path / "a.bin"
    with files.atomic_path(path, checksum=True) as tmp:
        tmp.write_bytes(os.urandom(4096))
    assert files.checksum_problem(path) is None
    record = json.loads(files.checksum_path(path).read_text())
    assert record == {"file": "a.bin", "bytes": 4096, "sha256": files.file_sha256(path)}
    for name, (damage, needle) in DAMAGE.items():
        copy = tmp_path / name.replace(" ", "-")
        copy.write_bytes(path.read_bytes())
        files.checksum_path(copy).write_text(files.checksum_path(path).read_text())
        damage(copy)
        with pytest.raises(files.ChecksumError) as err:
            files.verify_checksum(copy)
        assert str(err.value).startswith(f"{copy}: ") and needle in str(err.value)


def test_a_checksum_recorded_by_a_killed_writer_is_put_in_place(tmp_path):
    """Killed between renaming the file and renaming its checksum beside it: the rerun's cleanup
    completes the second rename when the checksum describes the file, else drops it."""
    good, stale = tmp_path / "good.parquet", tmp_path / "stale.parquet"
    for path in (good, stale):
        path.write_bytes(os.urandom(100))
        sums = files.write_checksum(
            path, path, files.file_sha256(path)
        )  # as atomic_path does, before its renames
        os.replace(sums, files.temp_path(files.checksum_path(path), 999_999_999))  # a dead pid
    stale.write_bytes(os.urandom(100))  # the kill came before this file's rename
    remove_stale_temps(tmp_path)
    assert files.checksum_problem(good) is None
    assert "no checksum recorded" in files.checksum_problem(stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "good.parquet",
        "good.parquet.sha256.json",
        "stale.parquet",
    ]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return shared_run(tmp_path_factory, "generated", generated_run)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    return shared_run(tmp_path_factory, "extracted", extracted_run)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_raw_part_is_named_by_merge_and_quality_and_generated_again(
    tmp_path, generated, monkeypatch, capsys, damage
):
    shutil.copytree(generated, tmp_path, dirs_exist_ok=True)
    params = tmp_path / "params.yaml"
    params.write_text(params.read_text().replace(str(generated), str(tmp_path)))
    reference = outputs(tmp_path / "data/raw/d")
    (part,) = sorted((tmp_path / "data/raw/d").glob("part-*.parquet"))
    hurt, needle = DAMAGE[damage]
    hurt(part)

    for main, args in ((merge.main, merge_args), (quality.main, quality_args)):
        code, _, err = run_stage(main, args(tmp_path, params), monkeypatch, capsys)
        assert code == 1, err
        assert f"{part}: " in err and needle in err, err
        assert "rerun generate for its dataset" in err
    assert not (tmp_path / "data/merged").exists()

    code, out, err = run_stage(generate.main, generate_args(tmp_path, params), monkeypatch, capsys)
    assert code == 0, err
    assert f"[generate d] {part}: " in out and "its turns are generated again" in out, out
    assert outputs(tmp_path / "data/raw/d") == reference
    code, _, err = run_stage(merge.main, merge_args(tmp_path, params), monkeypatch, capsys)
    assert code == 0, err
    assert leftovers(tmp_path) == []


def test_damaged_shards_are_named_by_train_and_extracted_again(
    tmp_path, extracted, monkeypatch, capsys
):
    hidden = tmp_path / "hidden"
    shutil.copytree(extracted / "hidden", hidden)
    for name in ("merged", "vocab.safetensors"):
        os.symlink(extracted / name, tmp_path / name)
    demo_params(tmp_path)
    shards = sorted(hidden.glob("shard-*.safetensors"))
    assert len(shards) >= 3
    original = {p.name: p.read_bytes() for p in shards}
    flip_bit(shards[1])
    truncate(shards[2])

    code, _, err = run_stage(train.main, train_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 1, err
    assert f"error: {shards[1]}: its sha256 differs" in err, err
    assert "rerun extract (it extracts a damaged shard again)" in err
    assert not (tmp_path / "models/drafter").exists()

    untouched = {p.name: p.stat().st_mtime_ns for p in shards if p not in shards[1:3]}
    code, out, err = run_stage(extract.main, extract_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 0, err
    assert f"[extract] {shards[1]}: its sha256 differs" in out, out
    assert f"[extract] {shards[2]}: " in out and "truncated" in out, out
    assert {n: (hidden / n).stat().st_mtime_ns for n in untouched} == untouched
    assert {p.name: p.read_bytes() for p in shards} == original  # the same tensors, bytes
    code, _, err = run_stage(train.main, train_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 0, err
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("victim", ["index.parquet", "last.pt"])
def test_a_damaged_index_or_checkpoint_is_named_by_train(
    tmp_path, extracted, monkeypatch, capsys, victim
):
    shutil.copytree(extracted / "hidden", tmp_path / "hidden")
    for name in ("merged", "vocab.safetensors"):
        os.symlink(extracted / name, tmp_path / name)
    demo_params(tmp_path)
    if victim == "last.pt":
        code, _, err = run_stage(train.main, train_args(tmp_path, "hidden"), monkeypatch, capsys)
        assert code == 0, err
        path = tmp_path / "checkpoints" / "last.pt"
    else:
        path = tmp_path / "hidden" / "index.parquet"
    truncate(path)
    code, _, err = run_stage(train.main, train_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 1, err
    assert f"error: {path}: " in err and "truncated" in err, err


@pytest.mark.slow
@pytest.mark.integration
def test_dvc_repro_over_raw_data_of_another_fingerprint_regenerates_saying_why(tmp_path):
    def small(params):
        params["datasets"] = {"sharegpt": params["datasets"]["sharegpt"]}
        params["datasets"]["sharegpt"]["prep"]["max_samples"] = 4
        params["generate"]["max_new_tokens"] = 8

    repo = copy_project(tmp_path / "repo", small)
    sh(["dvc", "repro", "generate@sharegpt"], repo)
    raw = repo / "data/raw/sharegpt"
    first = read_raw(raw)
    old = set(first.column("fingerprint").to_pylist())

    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["generate"]["seed"] = 1  # a sampling value: another fingerprint
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = sh(["dvc", "repro", "generate@sharegpt"], repo)
    out = proc.stdout + proc.stderr
    assert ran_stages(out) == {"check", "generate@sharegpt"}  # the edited params are checked
    again = read_raw(raw)
    new = set(again.column("fingerprint").to_pylist())
    assert len(new) == 1 and new != old and again.num_rows == first.num_rows
    assert (
        "the raw data in data/raw/sharegpt was generated otherwise: sampling.seed 0 -> 1 "
        "(generate's sampling values)" in out
    ), out
    assert "so sharegpt is generated again from the start" in out
    report = json.loads((repo / "reports/generate/sharegpt.json").read_text())
    assert report["new_samples"] == report["samples"] == 4
    assert leftovers(repo / "data") == []
