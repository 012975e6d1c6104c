"""The generation engines params name, and the SGLang servers a stage starts itself (`launch`)."""

from __future__ import annotations

import dataclasses

from ..cli import StageError, params_key
from ..engines import Sampling
from ..params.generate import GenerateParams
from ..params.server import SGLangLaunchParams
from ..params.target import TargetParams
from ..serving.launch import SGLangServer, launch_command, server_url, start_server
from ..target_model.tokenizer import pad_id
from ..target_model.tokens import TokenRoles
from .target import api_key


def server_command(launch: SGLangLaunchParams, target: TargetParams) -> list[str]:
    """The `python -m sglang.launch_server ...` command serving the target, from params."""
    return launch_command(
        launch.model_path or target.path,
        dataclasses.asdict(launch.server_args),
        launch.extra_args,
        trust_remote_code=target.trust_remote_code,
        module=launch.module,
    )


def start_launched(launch: SGLangLaunchParams, command: list[str], key: str) -> SGLangServer:
    """Start `command` and wait until it answers /health (it stops when the process exits);
    `key` is the params section of `launch`, named in errors."""
    with params_key(key):
        return start_server(
            command,
            server_url(launch.server_args.host, launch.server_args.port),
            launch.health_timeout_s,
            launch.log_file,
        )


def sampling_for(gen: GenerateParams, roles: TokenRoles) -> Sampling:
    return Sampling(
        max_new_tokens=gen.max_new_tokens,
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        seed=gen.seed,
        stop_ids=tuple(roles.stop_ids),
    )


def make_engine(gen: GenerateParams, target: TargetParams, tokenizer):
    """The generation engine params name (for sglang with `launch`, its server started)."""
    if gen.engine == "hf":
        from ..engines.hf import HFEngine
        from ..target_model.model import load_causal_lm

        with params_key("target"):
            model = load_causal_lm(
                target.path,
                target.device,
                target.dtype,
                target.trust_remote_code,
                target.cpu_threads,
            )
        return HFEngine(model, pad_id(tokenizer), gen.batch_size)
    if gen.engine == "sglang":
        from ..engines.sglang_http import SGLangEngine

        s, urls = gen.sglang, gen.sglang.urls
        if s.launch is not None:
            urls = [
                start_launched(
                    s.launch, server_command(s.launch, target), "generate.sglang.launch"
                ).url
            ]
        key = api_key(s.api_key_env, "generate.sglang.api_key_env")
        with params_key("generate.sglang"):
            return SGLangEngine(
                urls,
                s.concurrency,
                s.timeout_s,
                s.connect_timeout_s,
                s.max_retries,
                s.backoff_s,
                s.backoff_max_s,
                api_key=key,
            )
    raise StageError(f"generate.engine: {gen.engine!r} is not one of 'hf', 'sglang'")
