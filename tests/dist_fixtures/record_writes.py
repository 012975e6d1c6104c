"""Run a stage module as `python -m <module> ARGS` would, recording what each rank puts in place.

Usage: record_writes.py <module> ARGS, with RECORD_DIR (where the record goes) and RECORD_ROOT
(only files under it are recorded) in the environment. Every stage output is written to a temporary
name and renamed with os.replace, so wrapping os.replace sees each completed file: rank r appends
`<n>\t<path>` to RECORD_DIR/writes-<r>.tsv and keeps a copy as RECORD_DIR/<r>-<n>-<name>, so a file
overwritten later (a checkpoint) can still be read as it was. The environment each rank had when it
joined the process group goes to RECORD_DIR/env-<r>.json.
"""

import json
import os
import runpy
import shutil
import sys
from pathlib import Path

import torch.distributed

from stages.runtime.outputs import TEMP_NAME

RECORD_DIR = Path(os.environ["RECORD_DIR"])
RECORD_ROOT = Path(os.environ["RECORD_ROOT"]).resolve()
RANK = os.environ.get("RANK", "0")
replace = os.replace
init_process_group = torch.distributed.init_process_group
written = []


def recording_replace(src, dst, **kwargs):
    replace(src, dst, **kwargs)
    dst = Path(dst).resolve()
    # a move onto a temp name (`.<name>.tmp-<pid>`: a safetensors file out of its folder) is not
    # a completed file; the rename of that temp into place comes next
    if dst.is_file() and dst.is_relative_to(RECORD_ROOT) and not TEMP_NAME.match(dst.name):
        written.append(dst)
        shutil.copyfile(dst, RECORD_DIR / f"{RANK}-{len(written)}-{dst.name}")
        with open(RECORD_DIR / f"writes-{RANK}.tsv", "a") as log:
            log.write(f"{len(written)}\t{dst}\n")


def recording_init(*args, **kwargs):
    (RECORD_DIR / f"env-{RANK}.json").write_text(json.dumps(dict(os.environ)))
    return init_process_group(*args, **kwargs)


os.replace = recording_replace
torch.distributed.init_process_group = recording_init
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
