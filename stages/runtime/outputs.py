"""A stage's output folder: the temp files a killed run left behind, the lock that keeps a second
process out, and emptying it for a fresh run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from .files import CHECKSUM_SUFFIX, checksum_path, file_sha256, remove_path, write_failures

LOCK_NAME = ".stage.lock"


class OutputLocked(OSError):
    """Another running process holds the output folder's lock."""

    def __init__(self, message: str, path: Path):
        super().__init__(errno.EBUSY, message, str(path))
        self.message = message

    def __str__(self) -> str:
        return self.message


TEMP_NAME = re.compile(r"^\..+\.tmp-(\d+)$")  # `.<name>.tmp-<pid>`: `temp_path`'s names


def remove_stale_temps(directory: Path | str) -> list[Path]:
    """Remove the temp files (`.<name>.tmp-<pid>`) in `directory` whose process is gone, and
    checksum files whose file is gone.

    A kill -9 runs no cleanup, and a stage's output directory is hashed by DVC as a whole, so a
    dead writer's half-written shard would join the output. A running process's temp files are
    kept: under torchrun the other ranks write into the same directory (pids are this host's: a
    directory shared between hosts needs every host's writers stopped first). A checksum a dead
    writer had recorded but not yet renamed beside its file (killed between the two renames) is
    put in place when it matches the file, so the file counts as written.
    """
    directory = Path(directory)
    stale = [
        p
        for p in directory.glob(".*.tmp-*")
        if (m := TEMP_NAME.match(p.name)) and not _running(int(m.group(1)))
    ]
    completed = [p for p in stale if _complete_checksum(p)]
    stale = [p for p in stale if p not in completed]
    orphans = [
        p
        for p in directory.glob(f"*{CHECKSUM_SUFFIX}")
        if not (directory / p.name.removesuffix(CHECKSUM_SUFFIX)).exists()
    ]
    for path in stale + orphans:
        remove_path(path)
    if stale:
        print(
            f"[io] removed {len(stale)} temp file(s) of killed processes in {directory}: "
            f"{', '.join(p.name for p in stale)}"
        )
    if completed:
        print(
            f"[io] put {len(completed)} checksum(s) a killed process had recorded beside their "
            f"file in {directory}"
        )
    if orphans:
        print(
            f"[io] removed {len(orphans)} checksum file(s) without their file in {directory}: "
            f"{', '.join(p.name for p in orphans)}"
        )
    return stale + orphans


def _complete_checksum(temp: Path) -> bool:
    """Move a dead writer's recorded checksum (`.<file>.sha256.json.tmp-<pid>`) into place when
    it describes the file now there (it was killed after renaming the file); True if moved."""
    m = TEMP_NAME.match(temp.name)
    name = temp.name[1 : temp.name.rindex(".tmp-")] if m else ""
    if not name.endswith(CHECKSUM_SUFFIX) or not temp.is_file():
        return False
    data = temp.with_name(name.removesuffix(CHECKSUM_SUFFIX))
    try:
        record = json.loads(temp.read_text())
        matches = (
            data.is_file()
            and data.stat().st_size == int(record["bytes"])
            and file_sha256(data) == record["sha256"]
        )
    except (ValueError, KeyError, TypeError, OSError):
        return False
    if matches:
        os.replace(temp, checksum_path(data))
    return matches


def remove_stale_temps_around(*outputs: Path | str) -> list[Path]:
    """remove_stale_temps in the folder of every output a stage writes (a file's or a folder's
    temp sibling: `reports/.train.json.tmp-<pid>`, `models/.drafter.tmp-<pid>`) and inside each
    output that is a folder; a stage calls it before it writes anything."""
    folders: list[Path] = []
    for out in map(Path, outputs):
        folders.append(out.parent)
        if out.is_dir():
            folders.append(out)
    removed: list[Path] = []
    for folder in dict.fromkeys(folders):
        removed += remove_stale_temps(folder)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def empty_dir(directory: Path | str, keep: tuple[str, ...] = (LOCK_NAME,)) -> None:
    """Remove everything in `directory` but the names in `keep` (its lock, held by this process)."""
    directory = Path(directory)
    if not directory.exists():
        return
    for path in directory.iterdir():
        if path.name not in keep:
            remove_path(path)


@contextlib.contextmanager
def output_lock(directory: Path | str, owner: str = "") -> Iterator[Path]:
    """Hold `<directory>/.stage.lock` while writing the folder: a second process (a stage started
    twice by hand) is refused with the holder's pid, instead of interleaving its writes.

    The lock is an flock on the file, which the kernel releases when its holder dies, so a lock
    left by a killed process (its pid in the file, not running) is taken over, and the file is
    removed when its holder ends, before DVC hashes the folder (with the folder, when this call
    created it and it is still empty). `owner`: a line for the message.
    """
    directory = Path(directory)
    path = directory / LOCK_NAME
    created = not directory.exists()
    with write_failures(path):
        directory.mkdir(parents=True, exist_ok=True)
    while True:
        with write_failures(path):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(path)
            os.close(fd)
            raise OutputLocked(
                f"{directory} is being written by another process ({holder or 'unknown'}, "
                f"lock {path}); wait for it to finish or stop it, then rerun",
                path,
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the file was removed by its last holder after we opened it: again
    stale = _read_holder(path)
    if stale:
        print(f"[io] took over the lock of a process that is gone ({stale}) in {directory}")
    me = f"pid {os.getpid()}" + (f", {owner}" if owner else "")
    os.ftruncate(fd, 0)
    os.pwrite(fd, (me + "\n").encode(), 0)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # while still holding the lock: a waiting process opens a new file
        os.close(fd)
        if created:  # a run that failed before writing leaves no empty folder behind
            with contextlib.suppress(OSError):
                directory.rmdir()


def _read_holder(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
