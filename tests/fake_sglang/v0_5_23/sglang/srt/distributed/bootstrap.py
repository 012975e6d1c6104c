"""The process's parallel groups, built once (the release refuses a second call)."""

import fake_core

from sglang.srt.runtime_context import _published

_BUILT: list = []


def init_parallel_runtime(*, server_args, device, dist_port):
    if _BUILT:
        raise RuntimeError("init_parallel_runtime may run once per process")
    args, ranks = _published()
    if args is not server_args:
        raise RuntimeError("init_parallel_runtime with a ServerArgs that was not published")
    fake_core.join_group(server_args.tp_size, server_args.pp_size, ranks.world_rank, dist_port)
    _BUILT.append(True)
    fake_core.record("init_parallel_runtime", device=device)


def init_layer_runtime(*, model_config):
    if not _BUILT:
        raise RuntimeError("init_layer_runtime before init_parallel_runtime")
