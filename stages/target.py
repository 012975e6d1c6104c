"""The target model's tokenizer and token roles, as every stage sees them."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from transformers import AutoTokenizer

from .config import SGLangLaunchParams, TargetParams
from .tokens import TokenRoles, learn_roles


def load_tokenizer(target: TargetParams):
    """The target's tokenizer, with the chat template from params when the model ships none."""
    path = Path(target.path)
    if not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
        raise FileNotFoundError(f"target.path: {path} holds no model or tokenizer; point it at a "
                                f"local Hugging Face model directory")
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=target.trust_remote_code,
                                        local_files_only=True)
    if target.chat_template:
        tok.chat_template = Path(target.chat_template).read_text()
    if not tok.chat_template:
        raise ValueError(f"target.chat_template: the tokenizer at {path} has no chat template; "
                         f"give a Jinja template file in target.chat_template")
    return tok


def token_roles(target: TargetParams, tokenizer) -> TokenRoles:
    return learn_roles(tokenizer, target.roles)


def server_command(launch: SGLangLaunchParams, target: TargetParams) -> list[str]:
    """The `python -m sglang.launch_server ...` command serving the target, from params."""
    from .engines.sglang_server import launch_command
    return launch_command(launch.model_path or target.path, dataclasses.asdict(launch.server_args),
                          launch.extra_args, trust_remote_code=target.trust_remote_code,
                          module=launch.module)


def start_launched(launch: SGLangLaunchParams, command: list[str]):
    """Start `command` and wait until it answers /health (it stops when the process exits)."""
    from .engines.sglang_server import server_url, start_server
    return start_server(command, server_url(launch.server_args.host, launch.server_args.port),
                        launch.health_timeout_s, launch.log_file)


def render_prompt(tokenizer, messages: list[dict], tools: list | None, template_kwargs: dict,
                  generation: bool = True) -> list[int]:
    """Prompt ids exactly as serving builds them: the chat template with the generation prompt
    (or, with generation False, the conversation alone)."""
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation,
                                         tokenize=True, return_dict=False, **template_kwargs)


def pad_id(tokenizer) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return tid
    return 0


def model_fingerprint(target: TargetParams) -> str:
    """Hash of everything in the model directory that shapes tokens (weights, config, tokenizer)."""
    h = hashlib.sha256()
    path = Path(target.path)
    for f in sorted(path.iterdir()):
        if f.is_file() and f.suffix in {".json", ".safetensors", ".model", ".jinja", ".txt"}:
            h.update(f.name.encode())
            h.update(_file_digest(f))
    if target.chat_template:
        h.update(Path(target.chat_template).read_bytes())
    h.update(json.dumps([target.template_kwargs, target.roles, target.dtype],
                        sort_keys=True).encode())
    return h.hexdigest()[:16]


def _file_digest(path: Path, whole_up_to: int = 64 << 20, edge: int = 1 << 20) -> bytes:
    """Whole-file hash for small files; size + first and last MiB for weight shards of GBs."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= whole_up_to:
            return hashlib.sha256(f.read()).digest()
        head = f.read(edge)
        f.seek(size - edge)
        return hashlib.sha256(str(size).encode() + head + f.read(edge)).digest()
