"""The target's tokenizer and roles, and the API key a params key names, built from
params for the stages."""

from __future__ import annotations

import os
from pathlib import Path

from ..cli import StageError, params_key
from ..params.target import TargetParams
from ..target_model.tokenizer import load_tokenizer
from ..target_model.tokens import TokenRoles, learn_roles

TEMPLATES = Path("templates")  # a dep of every stage that reads target.chat_template (dvc.yaml)


def target_tokenizer(target: TargetParams):
    if problem := untracked_template(target):
        print(f"[target] warning: {problem}")
    with params_key("target"):
        return load_tokenizer(target.path, target.chat_template, target.trust_remote_code)


def untracked_template(target: TargetParams) -> str | None:
    """Why an edit of the chat template file would rerun no stage, or None. Params hold only
    its path; dvc.yaml tracks the files under templates/ and the target's directory."""
    if not target.chat_template:
        return None
    template = Path(target.chat_template).resolve()
    if any(template.is_relative_to(d.resolve()) for d in (TEMPLATES, Path(target.path))):
        return None
    return (
        f"target.chat_template {target.chat_template} is outside {TEMPLATES}/ and the target's "
        f"directory, so DVC does not track its contents: editing it reruns nothing. Keep it in "
        f"{TEMPLATES}/ (a dep of the stages that render prompts)"
    )


def target_roles(target: TargetParams, tokenizer) -> TokenRoles:
    with params_key("target"):
        return learn_roles(tokenizer, target.roles)


def api_key(env_name: str | None, key: str) -> str | None:
    """The API key held by the environment variable `env_name` (params `key` names the variable,
    never the key); None when no variable is named. An unset or empty variable fails naming it."""
    if env_name is None:
        return None
    value = os.environ.get(env_name, "")
    if not value.strip():
        raise StageError(
            f"{key}: the environment variable {env_name} is not set (or empty); export the "
            f"server's API key in it (e.g. `read -rs {env_name} && export {env_name}`), or set "
            f"{key} to null for a server without --api-key"
        )
    return value.strip()
