"""A full disk (or a read-only folder) while a stage writes raw parts, shards, checkpoints, the
export or reports: one line naming the path and the bytes it was about to write (exit code 1),
no half-written file where the next stage reads (the complete files before it stay, each with its
checksum), and the rerun after space is freed completes with the outputs of an uninterrupted run.

The fast tests make each writer fail the way its library does on a full disk (pyarrow and open()
with errno 28, safetensors in its message, torch.save with "unexpected pos" and no errno, on a
disk with next to nothing free); the slow one fills a real tmpfs in a private mount namespace.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import safetensors.torch
import torch
from safetensors import SafetensorError

from stages import extract, generate, train
from stages.artifacts import hidden
from stages.artifacts.raw import read_raw
from stages.runtime import files
from tests.conftest import ROOT
from tests.reliability import (
    extract_args,
    extracted_run,
    generate_args,
    generated_run,
    leftovers,
    outputs,
    shared_run,
    train_args,
    tree,
)
from tests.stage_runner import run_stage

Usage = namedtuple("Usage", "total used free")
MESSAGE = re.compile(
    r"^error: no space left writing (?P<path>\S+): about (?P<size>[\d,.]+ \w+) to write, "
    r"[\d,.]+ \w+ free on the file system of \S+ \(the partial file was removed; nothing was put "
    r"at (?P<name>\S+)\); free space and rerun",
)


class DiskFull:
    """Makes a writer fail on its `k`-th call for a path matching `match`, the way it fails on a
    full disk: the temp file half written, then the library's own error."""

    def __init__(self, monkeypatch, k: int = 1):
        self.monkeypatch, self.k, self.calls = monkeypatch, k, 0
        self.full = False

    def hit(self, path, match: str) -> bool:
        if not re.search(match, str(path)):
            return False
        self.calls += 1
        if self.calls == self.k:
            self.full = True
            return True
        return False

    def parquet(self, match: str):
        real = pq.write_table

        def write_table(table, where, *args, **kwargs):
            real(table, where, *args, **kwargs)
            if self.hit(where, match):
                half(where)
                raise OSError(
                    errno.ENOSPC,
                    "Error writing bytes to file. Detail: [errno 28] No space left on device",
                )

        self.monkeypatch.setattr(pq, "write_table", write_table)

    def safetensors(self, module, match: str):
        real = safetensors.torch.save_file

        def save_file(tensors, where, *args, **kwargs):
            real(tensors, where, *args, **kwargs)
            if self.hit(where, match):
                half(where)
                raise SafetensorError(
                    "Error while serializing: I/O error: No space left on device (os error 28)"
                )

        self.monkeypatch.setattr(module, "save_file", save_file)

    def tensor_files(self, module, match: str):
        """The project's own safetensors writer (save_safetensors, into an atomic_file)."""
        real = module.save_safetensors

        def save_safetensors(tensors, out, metadata=None):
            if self.hit(out.out.name, match):
                out.write(b"half a shard")
                raise OSError(errno.ENOSPC, "No space left on device")
            real(tensors, out, metadata)

        self.monkeypatch.setattr(module, "save_safetensors", save_safetensors)

    def torch_save(self, match: str):
        real, usage = torch.save, shutil.disk_usage

        def save(obj, where, *args, **kwargs):
            real(obj, where, *args, **kwargs)
            if self.hit(where, match):
                half(where)
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576")

        def disk_usage(path):  # what a full disk reports, until the temp file is removed
            real_usage = usage(path)
            return Usage(real_usage.total, real_usage.total, 4096) if self.full else real_usage

        self.monkeypatch.setattr(torch, "save", save)
        self.monkeypatch.setattr(shutil, "disk_usage", disk_usage)

    def text(self, match: str):
        real = Path.write_bytes

        def write_bytes(path, data):
            if self.hit(path, match):
                real(path, data[: len(data) // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(path, data)

        self.monkeypatch.setattr(Path, "write_bytes", write_bytes)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return shared_run(tmp_path_factory, "generated", generated_run)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory):
    return shared_run(tmp_path_factory, "extracted", extracted_run)


def half(path) -> None:
    path = Path(path)
    os.truncate(path, path.stat().st_size // 2)


def assert_one_line_naming(err: str, final: Path) -> None:
    line = err.strip().splitlines()[-1]
    match = MESSAGE.match(line)
    assert match, err
    assert match["path"] == str(final) and match["name"] == final.name, line


def copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    params = dst / "params.yaml"
    params.write_text(params.read_text().replace(str(src), str(dst)))


def test_raw_parts_and_the_generate_report(tmp_path, generated, monkeypatch, capsys):
    copy(generated, tmp_path)
    reference = outputs(tmp_path / "data/raw/d")
    raw = tmp_path / "data/raw/d"
    shutil.rmtree(raw)
    params = tmp_path / "params.yaml"
    full = DiskFull(monkeypatch, k=2)
    full.parquet(r"raw/d/\.part-\d+\.parquet\.tmp-")
    code, _, err = run_stage(generate.main, generate_args(tmp_path, params), monkeypatch, capsys)
    assert code == 1
    assert_one_line_naming(err, raw / "part-00001.parquet")
    assert tree(raw) == ["part-00000.parquet", "part-00000.parquet.sha256.json"]
    assert files.checksum_problem(raw / "part-00000.parquet") is None
    assert not (tmp_path / "reports/generate/d.json").exists()
    monkeypatch.undo()

    full = DiskFull(monkeypatch)
    full.text(r"reports/generate/\.d\.json\.tmp-")
    code, _, err = run_stage(generate.main, generate_args(tmp_path, params), monkeypatch, capsys)
    assert code == 1
    assert_one_line_naming(err, tmp_path / "reports/generate/d.json")
    assert outputs(raw) == reference  # complete: only the report was left
    assert not (tmp_path / "reports/generate/d.json").exists()
    monkeypatch.undo()

    code, out, err = run_stage(generate.main, generate_args(tmp_path, params), monkeypatch, capsys)
    assert code == 0, err
    assert "nothing left to generate" in out
    assert outputs(raw) == reference and len(read_raw(raw)) == len(reference)
    assert leftovers(tmp_path) == []


def test_shards(tmp_path, extracted, monkeypatch, capsys):
    os.symlink(extracted / "merged", tmp_path / "merged")
    shutil.copy2(extracted / "params.yaml", tmp_path / "params.yaml")
    out = tmp_path / "hidden"
    full = DiskFull(monkeypatch, k=2)
    full.tensor_files(hidden, r"hidden/\.shard-\d+\.safetensors\.tmp-\d+$")
    code, _, err = run_stage(extract.main, extract_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 1
    assert_one_line_naming(err, out / "shard-00001.safetensors")
    # several threads write shards: one put before the failure was seen may have completed
    written = tree(out)
    assert written[:3] == [
        "meta.json",
        "shard-00000.safetensors",
        "shard-00000.safetensors.sha256.json",
    ]
    for name in written[3:]:  # complete shards with their checksums, nothing else
        shard = name.removesuffix(files.CHECKSUM_SUFFIX)
        assert (
            re.fullmatch(r"shard-\d{5}\.safetensors", shard) and shard != "shard-00001.safetensors"
        )
        assert files.checksum_problem(out / shard) is None
    monkeypatch.undo()
    code, _, err = run_stage(extract.main, extract_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 0, err
    for path in (extracted / "hidden").iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("where", ["last.pt", "drafter", "train.json"])
def test_checkpoints_the_export_and_the_train_report(
    tmp_path, extracted, monkeypatch, capsys, where
):
    for name in ("hidden", "merged"):
        os.symlink(extracted / name, tmp_path / name)
    for name in ("vocab.safetensors", "params.yaml"):
        shutil.copy2(extracted / name, tmp_path / name)
    full = DiskFull(monkeypatch)
    if where == "last.pt":
        full.torch_save(r"checkpoints/\.last\.pt\.tmp-")
        final = tmp_path / "checkpoints/last.pt"
    elif where == "drafter":
        from stages.drafter import export

        full.safetensors(export, r"models/\.drafter\.tmp-\d+/model\.safetensors")
        final = tmp_path / "models/drafter"
    else:
        full.text(r"reports/\.train\.json\.tmp-")
        final = tmp_path / "reports/train.json"
    code, _, err = run_stage(train.main, train_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 1
    assert_one_line_naming(err, final)
    assert not final.exists() and leftovers(tmp_path) == []
    if where != "last.pt":  # training finished: its checkpoints are complete and checked
        assert files.checksum_problem(tmp_path / "checkpoints/last.pt") is None
    monkeypatch.undo()
    code, out, err = run_stage(train.main, train_args(tmp_path, "hidden"), monkeypatch, capsys)
    assert code == 0, err
    assert (tmp_path / "models/drafter/model.safetensors").exists()
    assert (tmp_path / "reports/train.json").exists() and leftovers(tmp_path) == []


def test_a_read_only_folder_is_named(tmp_path, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(files.WriteFailed) as err:
        files.write_json({"a": 1}, tmp_path / "reports" / "x.json")
    assert str(err.value) == (
        f"cannot write {tmp_path / 'reports/x.json'}: read-only file system ({tmp_path} is not "
        f"writable); make the folder writable (or point the output elsewhere) and rerun"
    )
    assert err.value.errno == errno.EROFS
    monkeypatch.undo()
    read_only_file = pytest.raises(
        files.WriteFailed, match="cannot write .*: read-only file system"
    )
    with read_only_file, files.atomic_path(tmp_path / "y.parquet") as tmp:
        raise OSError(errno.EROFS, f"Failed to open local file '{tmp}'")
    assert tree(tmp_path) == []


def test_an_error_that_is_not_about_space_stays_itself(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="a bug"), files.atomic_path(tmp_path / "z.json") as tmp:
        tmp.write_text("{")
        raise ValueError("a bug")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(real(p).total, real(p).total, 0))
    # a caller's own check keeps its words even on a full disk
    with pytest.raises(ValueError, match="a bug"), files.atomic_path(tmp_path / "z.json"):
        raise ValueError("a bug")
    assert tree(tmp_path) == []


def can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k none /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


FILL = r"""
set -u
mount -t tmpfs -o size=16m none "$WORK/disk"
cd "$WORK/disk"
cp -r "$WORK/src/." .
fill() {  # leave about $1 KiB free
  dd if=/dev/zero of=ballast bs=64k 2>/dev/null
  truncate -s -"$1"K ballast
}
for step in generate extract train; do
  eval "args=\$ARGS_$step"
  fill "$(eval echo \$FREE_$step)"
  $PY -m stages.$step $args > "$WORK/$step-full.log" 2>&1
  echo $? > "$WORK/$step-full.rc"
  find . -name '.*.tmp-*' > "$WORK/$step-temps.txt"
  rm ballast
  $PY -m stages.$step $args > "$WORK/$step-freed.log" 2>&1
  echo $? > "$WORK/$step-freed.rc"
done
cp -r data models reports "$WORK/result/"
"""


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.skipif(not can_mount_tmpfs(), reason="no user namespaces to mount a tmpfs in")
def test_a_real_full_disk_then_freed(tmp_path, generated, extracted):
    """generate, extract and train on a 16 MiB tmpfs filled to a few KiB (a ballast file), then
    rerun after the ballast is removed: each fails naming the file it was writing, leaves no temp
    file, and the rerun's outputs are those of the runs on a normal disk."""
    src = tmp_path / "src"
    (src / "data/prompts").mkdir(parents=True)
    shutil.copy2(generated / "data/prompts/d.parquet", src / "data/prompts/d.parquet")
    shutil.copytree(extracted / "merged", src / "data/merged")
    shutil.copy2(extracted / "vocab.safetensors", src / "data/vocab.safetensors")
    params = (extracted / "params.yaml").read_text().replace(str(extracted), ".")
    (src / "params.yaml").write_text(params.replace("./source.json", "unused"))
    for name in ("disk", "result"):
        (tmp_path / name).mkdir()
    env = dict(
        os.environ,
        WORK=str(tmp_path),
        PY=sys.executable,
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        ARGS_generate="d --prompts data/prompts/d.parquet --out data/raw/d "
        "--report reports/generate/d.json",
        FREE_generate="4",
        ARGS_extract="--merged data/merged --out data/hidden --report reports/extract.json",
        FREE_extract="200",
        ARGS_train="--hidden-dir data/hidden --vocab-file data/vocab.safetensors "
        "--checkpoint-dir models/checkpoints --out-dir models/drafter "
        "--report reports/train.json --plots reports/plots",
        FREE_train="600",
    )
    proc = subprocess.run(
        ["unshare", "-rm", "bash", "-c", FILL], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    for step in ("generate", "extract", "train"):
        full_log = (tmp_path / f"{step}-full.log").read_text()
        assert (tmp_path / f"{step}-full.rc").read_text().strip() == "1", full_log
        assert re.search(r"error: no space left writing \S+: about [\d,.]+ \w+ to write", full_log)
        assert (tmp_path / f"{step}-temps.txt").read_text() == "", step
        freed = (tmp_path / f"{step}-freed.log").read_text()
        assert (tmp_path / f"{step}-freed.rc").read_text().strip() == "0", freed
    result = tmp_path / "result"
    assert outputs(result / "data/raw/d") == outputs(generated / "data/raw/d")
    for path in (extracted / "hidden").glob("shard-*"):
        assert (result / "data/hidden" / path.name).read_bytes() == path.read_bytes()
    assert (result / "models/drafter/model.safetensors").exists()
    assert leftovers(result) == []
