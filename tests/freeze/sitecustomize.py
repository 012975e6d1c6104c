"""Freeze a stage process wherever it stands when a test asks, and say where that is.

Python imports this file at start-up in every process whose PYTHONPATH holds this folder (a test's
stage subprocess, or the one `dvc repro` starts for a stage); it acts only in the process running
`python -m $FREEZE_MODULE`. There, on SIGUSR1, a waiting thread writes where every other thread
stands to $FREEZE_STACKS (JSON: thread name -> [file, line, function] frames, outermost first) and
stops the process (SIGSTOP). The test then reads the file and the tree, and sends SIGKILL, so the
kill lands exactly where the stacks say, in whatever the process was doing: importing, loading,
computing, writing. (tests/stop_in_write.py freezes a process in a chosen write instead.)

Once the process exits, Python runs no other thread: the file then says so before it happens
(one frame, "interpreter exit"), and the test stops the process itself.
"""

import atexit
import json
import os
import signal
import sys
import threading


def stacks() -> dict[str, list]:
    """Where every thread but this one stands."""
    names = {t.ident: t.name for t in threading.enumerate()}
    found = {}
    for ident, frame in sys._current_frames().items():
        if ident == threading.get_ident():
            continue
        frames = []
        while frame is not None:
            frames.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
            frame = frame.f_back
        found[names.get(ident, str(ident))] = frames[::-1]
    return found


def freeze_on_signal(path: str) -> None:
    """SIGUSR1 is blocked here, in the main thread before any other thread starts, so every
    thread inherits the mask and the waiting thread alone takes the signal, whatever the others
    run (a forward pass in C, a write)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def wait_then_freeze() -> None:
        signal.sigwait({signal.SIGUSR1})
        write(path, stacks())
        # to this thread: the stop holds before the call returns, every thread stopped with it
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

    threading.Thread(target=wait_then_freeze, name="freeze", daemon=True).start()
    # registered first, so it runs last: Python finalizes right after it
    atexit.register(write, path, {"MainThread": [["<exit>", 0, "interpreter exit"]]})


def write(path: str, found: dict) -> None:
    """Whole or not at all: the test may stop the process at any instant."""
    with open(f"{path}.part", "w") as out:
        json.dump(found, out)
    os.replace(f"{path}.part", path)


def runs_module(module: str) -> bool:
    argv = sys.orig_argv
    return any(a == "-m" and b == module for a, b in zip(argv, argv[1:]))


if os.environ.get("FREEZE_STACKS") and runs_module(os.environ.get("FREEZE_MODULE", "")):
    freeze_on_signal(os.environ["FREEZE_STACKS"])
