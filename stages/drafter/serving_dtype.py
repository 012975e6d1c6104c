"""The dtype a serving engine runs the drafter in, from the rules in the engines' released source,
so that the export writes a drafter that runs in the dtype its target is served in.

SGLang (`srt/configs/model_config.py` `_get_and_verify_dtype`, the same in 0.5.14 to 0.5.23): at
the default `--dtype auto` every model it loads, the draft too, runs in the dtype its own text
config declares (`dtype`, else `torch_dtype`; float32 when it declares none), except that a float32
one runs as float16 (bfloat16 for Gemma). A drafter whose config says float32 beside a bf16 target
therefore runs in float16, is fed bf16 hidden states, and the server fails at its first request.

vLLM (0.33.0, `config/speculative.py`) builds the draft's model config with the target's resolved
dtype, so there the draft runs as its target does whatever its own config says.
"""

from __future__ import annotations

from typing import Any

import torch

FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, dict) else getattr(config, key, None)


def _name(dtype: Any) -> str | None:
    """`torch.bfloat16` or "bfloat16" -> "bfloat16"; None for nothing or an unknown name."""
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    return name if name in FLOAT_DTYPES else None


def declared_dtype(config: Any) -> str:
    """The dtype a config (a transformers config or config.json's dict) declares, read as SGLang
    reads it: the text config's `dtype`, else its `torch_dtype`; the wrapper's where the text
    config of a multimodal checkpoint declares none; float32 when nothing does."""
    text = _get(config, "text_config") or config
    for where in (text, config):
        for key in ("dtype", "torch_dtype"):
            name = _name(_get(where, key))
            if name:
                return name
    return "float32"


def sglang_auto_dtype(config: Any) -> str:
    """The dtype SGLang's `--dtype auto` runs a model of this config in."""
    declared = declared_dtype(config)
    if declared != "float32":
        return declared
    model_type = str(_get(_get(config, "text_config") or config, "model_type") or "")
    return "bfloat16" if model_type.startswith("gemma") else "float16"


def export_dtype(target_config: Any) -> torch.dtype:
    """The dtype the drafter is written in: the one its target declares, so that every engine's
    auto rule runs both alike."""
    return FLOAT_DTYPES[declared_dtype(target_config)]


def sglang_dtype_problem(drafter_config: dict, target_config: Any) -> str | None:
    """Why SGLang's auto rule would run the drafter in another dtype than its target, or None."""
    draft, target = sglang_auto_dtype(drafter_config), sglang_auto_dtype(target_config)
    if draft == target:
        return None
    return (
        f"dtype {declared_dtype(drafter_config)!r} makes SGLang's --dtype auto run the drafter "
        f"in {draft}, beside the target in {target} (its config declares "
        f"{declared_dtype(target_config)!r}): the server fails at its first request. Export in "
        f"the target's dtype, {declared_dtype(target_config)!r}"
    )
