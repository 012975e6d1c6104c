"""Atomic writes and checksums: every output is written to a temporary sibling, synced to disk and
renamed into place when complete, so neither a killed stage nor a crashed machine leaves a
half-written file under a name a later stage reads.

A file written with `checksum=True` gets a sidecar `<name>.sha256.json` (its size and sha256),
which readers verify: a file truncated or bit-flipped after it was written (a machine crash, a disk
fault) is found before it is used. A write that fails for lack of space or permission raises
`WriteFailed`, naming the path and the bytes it needed, with nothing left under the final name.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

CHECKSUM_SUFFIX = ".sha256.json"
# errors that say the disk (or its quota) is full, or the folder cannot be written
_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)
_FULL_TEXT = re.compile(
    r"no space left|os error 28|errno 28|disk quota exceeded|os error 122", re.I
)
_READ_ONLY_TEXT = re.compile(r"read-only file system|os error 30|errno 30", re.IGNORECASE)
_NEARLY_FULL = 1 << 20  # free bytes under which a failed write is put down to a full disk


class WriteFailed(OSError):
    """An output could not be written (no space, over quota, read-only or not permitted); nothing
    was put in its place and the partial temp file is gone."""

    def __init__(self, code: int, message: str, path: Path):
        super().__init__(code, message, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


class ChecksumError(ValueError):
    """A file differs from what was written (truncated, bit-flipped) or has no checksum."""


def atomic_path(
    final: Path | str, size: int | None = None, *, checksum: bool = False
) -> contextlib.AbstractContextManager[Path]:
    """Yield a temp path beside `final`; on success sync it and replace `final` with it (with
    `checksum`, then record its size and sha256 beside it), else remove it. `size`: about how many
    bytes will be written, named when the disk turns out to be full."""
    return _replacing(final, size, file_sha256 if checksum else None)


class HashingWriter:
    """A binary file that takes the sha256 of what is written to it as it goes. The hash runs on
    a thread of its own beside the writes (both let go of the GIL), one update at a time and in
    order, so a file costs the longer of the two rather than their sum. What is written must stay
    unchanged until the next write or `hexdigest`."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.digest = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        self._hashing: Future | None = None

    def write(self, data) -> int:
        self._hashed()
        self._hashing = self._hasher.submit(self.digest.update, data)
        return self.out.write(data)

    def hexdigest(self) -> str:
        self._hashed()
        return self.digest.hexdigest()

    def close(self) -> None:
        self._hasher.shutdown(wait=True)

    def _hashed(self) -> None:
        if self._hashing is not None:
            self._hashing.result()
            self._hashing = None


@contextlib.contextmanager
def atomic_file(final: Path | str, size: int | None = None) -> Iterator[HashingWriter]:
    """atomic_path with `checksum`, as a binary file open on the temp path: the sha256 recorded
    is taken from the bytes as they are written, so sealing a file of gigabytes does not read it
    back."""
    writer: HashingWriter | None = None

    def sha256(_: Path) -> str:
        assert writer is not None, "asked for before the file was opened"
        return writer.hexdigest()

    with _replacing(final, size, sha256) as tmp, open(tmp, "wb") as f:
        writer = HashingWriter(f)
        try:
            yield writer
        finally:
            writer.close()


@contextlib.contextmanager
def _replacing(
    final: Path | str, size: int | None, sha256: Callable[[Path], str] | None
) -> Iterator[Path]:
    """atomic_path's work; `sha256` gives the written temp file's hash, when one is recorded."""
    final = Path(final)
    with write_failures(final, size=size):
        final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final, os.getpid())
    remove_path(tmp)
    try:
        with write_failures(final, tmp, size):
            yield tmp
            _sync(tmp)
            sums = write_checksum(tmp, final, sha256(tmp)) if sha256 else None
            if tmp.is_dir() and final.exists():
                remove_path(final)
            os.replace(tmp, final)
            if sums is not None:
                os.replace(sums, checksum_path(final))
            sync_dir(final.parent)
    finally:
        remove_path(tmp)
        if sha256:
            remove_path(temp_path(checksum_path(final), os.getpid()))


def temp_path(final: Path, pid: int) -> Path:
    """Where process `pid` writes `final` before renaming it into place."""
    return final.with_name(f".{final.name}.tmp-{pid}")


@contextlib.contextmanager
def write_failures(final: Path, tmp: Path | None = None, size: int | None = None) -> Iterator[None]:
    """Within it, an error that write_failure recognises is raised as its WriteFailed (naming
    `final` and the bytes it needed); any other error as it is."""
    try:
        yield
    except Exception as err:
        failed = write_failure(err, final, tmp, size)
        if failed is None:
            raise
        raise failed from err


def write_failure(err: BaseException, final: Path, tmp: Path | None, size: int | None):
    """`err` as a WriteFailed when it came from a full disk, a quota, a read-only folder or a
    missing permission (None otherwise). Libraries say so differently: pyarrow and open() with
    errno 28, safetensors in its message, torch.save only with "unexpected pos", so a failure
    while the disk has next to nothing free counts as a full disk too."""
    if isinstance(err, WriteFailed):
        return None
    code = err.errno if isinstance(err, OSError) else None
    text = f"{type(err).__name__}: {err}"
    where = final.parent if final.parent.exists() else _existing_parent(final)
    try:
        free_at_failure = shutil.disk_usage(where).free
    except OSError:
        free_at_failure = None
    ours = err.filename if isinstance(err, OSError) else None
    about_here = (
        ours is None
        and str(final.parent) in text
        or (ours is not None and str(ours).startswith(str(final.parent)))
    )
    read_only = code == errno.EROFS or _READ_ONLY_TEXT.search(text)
    if read_only or (code in _DENIED and about_here):
        reason = "read-only file system" if read_only else os.strerror(code or errno.EACCES)
        return WriteFailed(
            code or errno.EROFS,
            f"cannot write {final}: {reason} ({where} is not writable); make the folder "
            f"writable (or point the output elsewhere) and rerun",
            final,
        )
    full = code in _FULL or _FULL_TEXT.search(text)
    nearly_full = free_at_failure is not None and free_at_failure < _NEARLY_FULL
    if not full and not (nearly_full and not isinstance(err, (ValueError, KeyError, TypeError))):
        return None  # a caller's own check (a ValueError...) keeps its words on a full disk too
    if tmp is not None:
        remove_path(tmp)
    free = shutil.disk_usage(where).free
    needed = f"about {_bytes(size)}" if size else "an unknown amount"
    return WriteFailed(
        code if code in _FULL else errno.ENOSPC,
        f"no space left writing {final}: {needed} to write, {_bytes(free)} free on the "
        f"file system of {where} (the partial file was removed; nothing was put at {final.name}); "
        f"free space and rerun, which continues from what is complete (the writer said: "
        f"{text[:300]})",
        final,
    )


def _existing_parent(path: Path) -> Path:
    for parent in path.parents:
        if parent.exists():
            return parent
    return Path("/")


def _bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


def _sync(path: Path) -> None:
    """Flush a written file (or every file of a written folder) to the disk before the rename, so
    a machine crash cannot leave the final name on data that never reached it."""
    if path.is_dir():
        for sub in sorted(path.rglob("*")):
            if sub.is_file():
                _fsync_file(sub)
        sync_dir(path)
    elif path.exists():
        _fsync_file(path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot sync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Checksums: `<name>.sha256.json` beside a file, {"file", "bytes", "sha256"}.


def checksum_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    buffer = bytearray(8 << 20)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def write_checksum(written: Path, final: Path, sha256: str) -> Path:
    """Record the size and `sha256` of `written` (the temp file that becomes `final`) in a temp
    sidecar, synced; the caller renames it to checksum_path(final) after `final` is in place.
    Returns the temp sidecar."""
    record = {"file": final.name, "bytes": written.stat().st_size, "sha256": sha256}
    sums = temp_path(checksum_path(final), os.getpid())
    sums.write_text(json.dumps(record) + "\n")
    _fsync_file(sums)
    return sums


def checksum_problem(path: Path | str) -> str | None:
    """Why `path` is not the file that was written (None: it is): missing, no checksum recorded,
    another size (truncated), another sha256 (bit-flipped)."""
    path = Path(path)
    sums = checksum_path(path)
    if not path.exists():
        return "missing"
    if not sums.exists():
        return (
            f"no checksum recorded ({sums.name} is missing: written by an older version, or "
            f"a crash came between the file and its checksum)"
        )
    try:
        record = json.loads(sums.read_text())
        size, sha = int(record["bytes"]), str(record["sha256"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"its checksum file {sums.name} is unreadable"
    actual = path.stat().st_size
    if actual != size:
        return f"{actual:,} bytes where {size:,} were written (truncated or cut off by a crash)"
    if file_sha256(path) != sha:
        return (
            "its sha256 differs from the one recorded when it was written (corrupted after "
            "writing: a machine crash or a disk fault)"
        )
    return None


def verify_checksum(path: Path | str) -> None:
    """Raise ChecksumError naming `path` when it is not the file that was written."""
    problem = checksum_problem(path)
    if problem:
        raise ChecksumError(f"{path}: {problem}")


def remove_with_checksum(path: Path) -> None:
    """Remove a file and its checksum, the checksum first: a kill in between leaves a file
    without a checksum (treated as not written), never a checksum without a file."""
    remove_path(checksum_path(path))
    remove_path(path)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        with contextlib.suppress(FileNotFoundError):  # another rank removed it first
            path.unlink()


def write_parquet(table: pa.Table, path: Path | str, *, checksum: bool = False) -> None:
    with atomic_path(path, table.nbytes, checksum=checksum) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def write_json(obj, path: Path | str) -> None:
    """JSON with NaN written as null (a rate over zero cases), which every reader accepts."""
    write_text(json.dumps(_finite(obj), indent=2, allow_nan=False) + "\n", path)


def _finite(obj):
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_csv(rows: list[dict], path: Path | str, columns: list[str] | None = None) -> None:
    """A CSV for `dvc plots`; the header comes from `columns`, else from the first row."""
    columns = columns or (list(rows[0]) if rows else [])
    buf = io.StringIO()
    if columns:
        writer = csv.DictWriter(buf, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    write_text(buf.getvalue(), path)


def write_text(text: str, path: Path | str) -> None:
    data = text.encode()
    with atomic_path(path, len(data)) as tmp:
        tmp.write_bytes(data)
