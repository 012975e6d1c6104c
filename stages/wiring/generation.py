"""The generation facts: every value that shapes a dataset's generated tokens, which its
fingerprint hashes (artifacts/raw.py) and a rerun compares, built from params and, for a server
engine, from what the servers report."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from transformers import AutoConfig

from ..cli import params_key
from ..drafter.serving_dtype import sglang_auto_dtype
from ..engines import Sampling
from ..params.target import TargetParams
from ..target_model.tokenizer import model_fingerprint


def recipe_facts(target: TargetParams, sampling: Sampling, regenerate: str) -> dict:
    """What shapes the generated tokens whatever the engine: the model's files (and the
    transformers version that renders its template), the template and its kwargs, the roles,
    every sampling value and the multi-turn mode."""
    template = Path(target.chat_template) if target.chat_template else None
    return {
        "model_files": model_fingerprint(target.path, None, None),
        "chat_template": hashlib.sha256(template.read_bytes()).hexdigest()[:16]
        if template
        else None,
        "template_kwargs": target.template_kwargs,
        "roles": target.roles,
        "sampling": json.loads(json.dumps(dataclasses.asdict(sampling))),  # as the rows store it
        "regenerate": regenerate,
    }


def in_process_facts(target: TargetParams) -> dict:
    """What shapes the tokens of the target run in this process (the hf engine), under the names
    a server's facts have (engines/sglang_http.py SERVED_FACTS): the dtype target.dtype resolves to
    on target.device, no quantization, no server."""
    from ..target_model.model import resolve_device, resolve_dtype

    with params_key("target"):
        dtype = resolve_dtype(target.dtype, resolve_device(target.device))
    return {"served_model": None, "dtype": str(dtype).removeprefix("torch."), "quantization": None}


# SGLang's --dtype and --kv-cache-dtype aliases
SERVER_DTYPES = {"half": "float16", "float": "float32", "bf16": "bfloat16"}


def served_facts(reported: dict, target: TargetParams) -> dict:
    """A server's facts with its --dtype resolved (`auto` as SGLang's rule runs the target's
    config, drafter/serving_dtype.py; the aliases by their names) and its --kv-cache-dtype named
    only where the cache is not kept in that dtype: the KV cache the hf engine keeps, and every
    fingerprint made before the KV cache's dtype was a fact."""
    dtype = reported.get("dtype")
    if dtype == "auto":
        with params_key("target"):
            dtype = sglang_auto_dtype(
                AutoConfig.from_pretrained(
                    target.path,
                    trust_remote_code=target.trust_remote_code,
                    local_files_only=True,
                )
            )
    dtype = SERVER_DTYPES.get(dtype, dtype) if dtype else None
    facts = {**reported, "dtype": dtype}
    kv = facts.pop("kv_cache_dtype", None)
    if kv not in (None, "auto") and SERVER_DTYPES.get(kv, kv) != dtype:
        facts["kv_cache_dtype"] = kv
    return facts


def engine_facts(engine, target: TargetParams) -> dict:
    """The engine's share of the generation facts: a server engine's as its servers report
    them, the in-process target's from params."""
    if hasattr(engine, "facts"):
        return served_facts(engine.facts(), target)
    return in_process_facts(target)


# The commit whose generate stage wrote raw data last without generated_by (its rows' facts).
LEGACY_COMMIT = "1f15548"


def legacy_fingerprint(target: TargetParams, sampling: Sampling, regenerate: str) -> str:
    """The fingerprint the stage of LEGACY_COMMIT wrote for these params: raw data from then
    records no facts, so it is kept when its rows' fingerprint equals this (the values hashed
    by that formula, not the facts: target.dtype as given, no server's). Keep it, and
    model_fingerprint, as they are (tests/fixtures/raw_before_facts holds rows that commit wrote):
    a change throws away every dataset generated before the facts were recorded."""
    settings = [target.template_kwargs, target.roles, target.dtype]
    model = model_fingerprint(target.path, target.chat_template, settings)
    values = {  # that commit's Sampling.__dict__, field by field
        "max_new_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "seed": sampling.seed,
        "stop_ids": sampling.stop_ids,
    }
    payload = json.dumps([model, values, regenerate], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
