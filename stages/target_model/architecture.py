"""Whether a target's layers keep a recurrent state, read from its config.json alone.

SGLang serves Mamba and linear-attention hybrids (Qwen3-Next's gated delta net, Kimi-Linear,
Nemotron-H, ...) through a state pool and a Mamba backend that its scheduler sets up. The capture
engine builds the model runner without a scheduler and hands it a prefill-only tree cache with no
state pool, as the releases' own scheduler-less drivers did before 0.5.21; so such a target is
refused before any stage loads it, naming its model type and architecture.
"""

from __future__ import annotations

# The `model_type` of every config class SGLang treats as a Mamba or linear-attention hybrid
# (its hybrid_arch.py, or ModelRunner's *_config properties before 0.5.16), over every supported
# release: tests/sglang_contract/test_recurrent_targets.py holds the list to each release.
RECURRENT_MODEL_TYPES = frozenset(
    {
        "NemotronH_Nano_VL_V2",
        "bailing_hybrid",
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "inkling_mm_model",
        "inkling_model",
        "intern_s2_preview",
        "jet_nemotron",
        "jet_vlm",
        "kimi_linear",
        "lfm2",
        "lfm2_moe",
        "lfm2_vl",
        "mamba",
        "mamba2",
        "minicpm_sala",
        "nemotron_h",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "zaya",
    }
)


def recurrent_model_type(config: dict) -> str | None:
    """The model type of a target's config.json (or of the language model it wraps, under
    `text_config`) when SGLang runs it with a recurrent state; None otherwise."""
    for part in (config, config.get("text_config") or {}):
        if part.get("model_type") in RECURRENT_MODEL_TYPES:
            return str(part["model_type"])
    return None
