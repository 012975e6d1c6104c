"""Run a stage module as `python -m <module> ARGS` would, and freeze the process (SIGSTOP) in its
STOP_COUNT-th write of a file matching STOP_AT: the temp file written, not yet renamed into place.
Under torchrun, STOP_RANK (when set) picks the one rank that stops; the others run on.

tests/runtime/test_kill9.py then sends SIGKILL, so the kill lands mid-write on every machine,
which polling the directory cannot promise (a small shard is written in under a millisecond).
"""

import fnmatch
import os
import runpy
import signal
import sys
import threading

PATTERN, COUNT = os.environ["STOP_AT"], int(os.environ["STOP_COUNT"])
STOP_RANK = os.environ.get("STOP_RANK")
STOPS = STOP_RANK is None or os.environ.get("RANK") == STOP_RANK
replace = os.replace
writes = 0


def stopping_replace(src, dst, **kwargs):
    global writes
    if STOPS and fnmatch.fnmatch(os.path.abspath(dst), PATTERN):
        writes += 1
        if writes == COUNT:
            # Sent to this thread, not the process: another thread could take a process's
            # SIGSTOP while this one went on to the rename (extract writes on a thread).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    replace(src, dst, **kwargs)


os.replace = stopping_replace
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
