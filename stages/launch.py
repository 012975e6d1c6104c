"""The SGLang servers a stage starts itself (`launch` in params), built from params."""

from __future__ import annotations

import dataclasses

from . import config
from .cli import params_key
from .engines import sglang_server
from .engines.sglang_server import SGLangServer, launch_command, server_url


def server_command(launch: config.SGLangLaunchParams, target: config.TargetParams) -> list[str]:
    """The `python -m sglang.launch_server ...` command serving the target, from params."""
    return launch_command(
        launch.model_path or target.path,
        dataclasses.asdict(launch.server_args),
        launch.extra_args,
        trust_remote_code=target.trust_remote_code,
        module=launch.module,
    )


def start_launched(launch: config.SGLangLaunchParams, command: list[str], key: str) -> SGLangServer:
    """Start `command` and wait until it answers /health (it stops when the process exits);
    `key` is the params section of `launch`, named in errors."""
    with params_key(key):
        return sglang_server.start_server(
            command,
            server_url(launch.server_args.host, launch.server_args.port),
            launch.health_timeout_s,
            launch.log_file,
        )
