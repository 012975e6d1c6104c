"""Library objects built from params, shared by the stages: the target's tokenizer, roles and
fingerprint."""

from __future__ import annotations

from . import config
from .cli import params_key
from .target.tokenizer import load_tokenizer, model_fingerprint
from .target.tokens import TokenRoles, learn_roles


def target_tokenizer(target: config.TargetParams):
    with params_key("target"):
        return load_tokenizer(target.path, target.chat_template, target.trust_remote_code)


def target_roles(target: config.TargetParams, tokenizer) -> TokenRoles:
    with params_key("target"):
        return learn_roles(tokenizer, target.roles)


def target_fingerprint(target: config.TargetParams) -> str:
    """Changes with the model, its template and everything in params that shapes its tokens."""
    return model_fingerprint(
        target.path, target.chat_template, [target.template_kwargs, target.roles, target.dtype]
    )
