"""Write the DFlash drafter as the checkpoint SGLang's DFLASH worker loads, and prove it loads.

The format, read in the source of every release from 0.5.14 to 0.5.23 (the same in all ten for
what is written here; later releases only add optional extras this export leaves off):

- config.json: `architectures: ["DFlashDraftModel"]` (srt/models/dflash.py's EntryClass), a
  Qwen3-style text config (model_type "qwen3", as the published DFlash drafters: the model reads
  hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
  intermediate_size, rms_norm_eps, hidden_act, attention_bias, max_position_embeddings and the
  rope fields), and `dflash_config` with block_size, target_layer_ids, num_target_layers and
  mask_token_id, which `parse_dflash_draft_config` (srt/speculative/dflash_utils.py) reads there
  first. mask_token_id is read only from dflash_config before 0.5.18 (top level too from then),
  so it goes there; block_size and num_target_layers are repeated at the top level, where
  Hugging Face loaders of DFlash checkpoints read them.
- model.safetensors: `fc.weight` [hidden, len(target_layer_ids) * hidden], `hidden_norm.weight`,
  `norm.weight` and per layer `layers.<i>.{input_layernorm, post_attention_layernorm}.weight`,
  `layers.<i>.self_attn.{q,k,v,o}_proj.weight`, `layers.<i>.self_attn.{q,k}_norm.weight`,
  `layers.<i>.mlp.{gate,up,down}_proj.weight`. `load_weights` stacks q/k/v into qkv_proj and
  gate/up into gate_up_proj and skips any name it cannot place without a word, so the check
  below refuses every key, shape and dtype but the expected ones. No embed_tokens and no lm_head:
  the worker uses the target's.

Tensors are in the target's dtype (stages/drafter/serving_dtype.py says why).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file

from ..drafter.export import (
    CONFIG_FILE,
    PROJECT_KEY,
    WEIGHTS_FILE,
    ExportError,
    layer_config,
    read_exported_config,
    write_checkpoint,
)
from ..drafter.layers import parse_version
from ..drafter.model import rope_fields, rope_serving_problem, target_facts
from ..drafter.serving_dtype import declared_dtype, sglang_dtype_problem
from .layers import default_target_layer_ids
from .model import DFlashConfig, DFlashDrafter

ARCHITECTURE = "DFlashDraftModel"
MODEL_TYPE = "qwen3"
DFLASH_KEYS = frozenset({"block_size", "target_layer_ids", "num_target_layers", "mask_token_id"})
# Every top-level key `serving_config` writes; the check refuses any other.
CONFIG_KEYS = frozenset(
    {
        "architectures",
        "model_type",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "hidden_act",
        "rms_norm_eps",
        "attention_bias",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "max_position_embeddings",
        "vocab_size",
        "tie_word_embeddings",
        "torch_dtype",
        "dtype",
        "block_size",
        "num_target_layers",
        "dflash_config",
        PROJECT_KEY,
    }
)


def expected_tensors(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Key -> shape of every tensor the checkpoint holds, as SGLang's model builds them."""
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layer = {
        "input_layernorm.weight": (H,),
        "self_attn.q_proj.weight": (q, H),
        "self_attn.k_proj.weight": (kv, H),
        "self_attn.v_proj.weight": (kv, H),
        "self_attn.o_proj.weight": (H, q),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "post_attention_layernorm.weight": (H,),
        "mlp.gate_proj.weight": (I, H),
        "mlp.up_proj.weight": (I, H),
        "mlp.down_proj.weight": (H, I),
    }
    tensors = {
        "fc.weight": (H, len(cfg.target_layer_ids) * H),
        "hidden_norm.weight": (H,),
        "norm.weight": (H,),
    }
    for i in range(cfg.num_hidden_layers):
        tensors.update({f"layers.{i}.{key}": shape for key, shape in layer.items()})
    return tensors


def serving_config(
    cfg: DFlashConfig, target_config: Any, *, sglang_version: str | None = None
) -> dict:
    """config.json: what SGLang reads, plus what the checkpoint was trained on and for which
    SGLang release (None: any)."""
    target = target_facts(target_config)
    dtype_name = declared_dtype(target_config)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        **layer_config(cfg, cfg.rope_scaling, cfg.hidden_act),
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
        "dflash_config": {
            "block_size": cfg.block_size,
            "target_layer_ids": list(cfg.target_layer_ids),
            "num_target_layers": cfg.num_target_layers,
            "mask_token_id": cfg.mask_token_id,
        },
        PROJECT_KEY: {
            "target_hf_indices": list(cfg.hf_indices),
            "target_architecture": target.architecture,
            "target_hidden_size": target.hidden_size,
            "sglang_version": sglang_version,
        },
    }


def sglang_view(config: dict) -> DFlashConfig:
    """The draft config SGLang derives from config.json: `dflash_config` first, then the top
    level, then its defaults (parse_dflash_draft_config and DFlashDraftModel.__init__)."""
    nested = config.get("dflash_config") or {}

    def dflash(key: str, default=None):
        return nested.get(key, config.get(key, default))

    heads = int(config["num_attention_heads"])
    layers = int(config["num_hidden_layers"])
    num_target_layers = int(dflash("num_target_layers", layers))
    ids = dflash("target_layer_ids")
    theta, scaling = rope_fields(config)
    return DFlashConfig(
        hidden_size=int(config["hidden_size"]),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(config.get("num_key_value_heads", heads)),
        head_dim=int(config.get("head_dim", int(config["hidden_size"]) // heads)),
        intermediate_size=int(config["intermediate_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
        vocab_size=int(config["vocab_size"]),
        target_hidden_size=int(config["hidden_size"]),
        num_target_layers=num_target_layers,
        target_layer_ids=tuple(
            default_target_layer_ids(num_target_layers, layers) if ids is None else ids
        ),
        block_size=int(dflash("block_size", 16)),
        mask_token_id=int(nested["mask_token_id"]),
        hidden_act=config.get("hidden_act", "silu"),
    )


def export_dflash(
    drafter: DFlashDrafter,
    out_dir: Path | str,
    target_config: Any,
    *,
    sglang_version: str | None = None,
) -> Path:
    """Write config.json and model.safetensors (in the target's dtype); check them as SGLang
    would load them before renaming the folder into place. `sglang_version` (e.g. "0.5.16"):
    the release that will serve the drafter, which yarn RoPE with mscale keys needs (see
    `rope_serving_problem`); None: every supported release."""
    return write_checkpoint(
        drafter,
        out_dir,
        target_config,
        serving_config(drafter.cfg, target_config, sglang_version=sglang_version),
        lambda tmp: check_export(tmp, target_config, sglang_version=sglang_version),
    )


def load_dflash(out_dir: Path | str) -> DFlashDrafter:
    """Rebuild the drafter from the exported files alone, its config as SGLang reads it."""
    out_dir = Path(out_dir)
    state = load_file(str(out_dir / WEIGHTS_FILE))
    drafter = DFlashDrafter(sglang_view(read_exported_config(out_dir)))
    drafter = drafter.to(state["fc.weight"].dtype)
    drafter.load_state_dict(state, strict=True)
    return drafter


def check_export(
    out_dir: Path | str, target_config: Any, *, sglang_version: str | None = None
) -> None:
    """Raise ExportError naming every key SGLang (at `sglang_version`; None: any supported
    release) would read wrongly, or not at all, from `out_dir`, for a drafter of the target
    `target_config`."""
    out_dir = Path(out_dir)
    config = read_exported_config(out_dir)
    problems = _config_problems(config)
    try:
        cfg = sglang_view(config)
    except (KeyError, TypeError, ValueError) as e:
        problems.append(f"{CONFIG_FILE}: SGLang cannot read it as a DFlash draft config: {e!r}")
    else:
        problems += _served_problems(config, cfg, target_config, sglang_version)
        problems += _weight_problems(out_dir / WEIGHTS_FILE, cfg, declared_dtype(config))
    if problems:
        raise ExportError(
            f"{out_dir} would load wrongly in SGLang's DFLASH worker:\n  - "
            + "\n  - ".join(problems)
        )


def _config_problems(config: dict) -> list[str]:
    """The key sets (exactly what the export writes: any other key may switch on a feature the
    training never had) and the fixed values."""
    problems = _key_set_problems(CONFIG_FILE, set(config), CONFIG_KEYS)
    nested = config.get("dflash_config")
    if isinstance(nested, dict):
        problems += _key_set_problems(f"{CONFIG_FILE}: dflash_config", set(nested), DFLASH_KEYS)
    fixed = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
    }
    problems += [
        f"{CONFIG_FILE}: {key} is {config.get(key)!r}, expected {value!r}"
        for key, value in fixed.items()
        if key in config and config[key] != value
    ]
    for key in ("block_size", "num_target_layers"):
        if isinstance(nested, dict) and key in config and config[key] != nested.get(key):
            problems.append(
                f"{CONFIG_FILE}: {key} {config[key]!r} differs from dflash_config.{key} "
                f"{nested.get(key)!r}; SGLang reads dflash_config's"
            )
    return problems


def _key_set_problems(where: str, have: set[str], want: set[str] | frozenset[str]) -> list[str]:
    problems = []
    if want - have:
        problems.append(f"{where}: missing keys {sorted(want - have)}")
    if have - want:
        problems.append(
            f"{where}: unexpected keys {sorted(have - want)} (the export writes none of them; "
            "SGLang may switch a draft feature on by them)"
        )
    return problems


def _served_problems(
    config: dict, cfg: DFlashConfig, target_config: Any, sglang_version: str | None
) -> list[str]:
    """What SGLang derived, against the target it will serve beside."""
    t = target_facts(target_config)
    problems = []
    for key, have, want in (
        ("hidden_size", cfg.hidden_size, t.hidden_size),
        ("vocab_size", cfg.vocab_size, t.vocab_size),
        ("dflash_config.num_target_layers", cfg.num_target_layers, t.num_hidden_layers),
    ):
        if have != want:
            problems.append(f"{CONFIG_FILE}: {key} is {have}, the target's is {want}")
    if cfg.max_position_embeddings < t.max_position_embeddings:
        problems.append(
            f"{CONFIG_FILE}: max_position_embeddings {cfg.max_position_embeddings} is below the "
            f"target's {t.max_position_embeddings}; later positions get no rotary angles"
        )
    recorded = (config.get(PROJECT_KEY) or {}).get("target_hf_indices")
    if recorded != list(cfg.hf_indices):
        problems.append(
            f"{CONFIG_FILE}: dflash_config.target_layer_ids {list(cfg.target_layer_ids)} make "
            f"SGLang capture HF hidden states {list(cfg.hf_indices)}; trained on {recorded} "
            f"({PROJECT_KEY}.target_hf_indices)"
        )
    declared, wanted = declared_dtype(config), declared_dtype(target_config)
    if declared != wanted:
        problems.append(
            f"{CONFIG_FILE}: dtype {declared!r} is not the target's {wanted!r}; export in the "
            "target's dtype, which SGLang runs both in"
        )
    version = parse_version(sglang_version) if sglang_version else None
    rope = rope_serving_problem(cfg.rope_scaling, version)
    dtype = sglang_dtype_problem(config, target_config)
    return problems + [f"{CONFIG_FILE}: {p}" for p in (rope, dtype) if p]


def _weight_problems(path: Path, cfg: DFlashConfig, declared: str) -> list[str]:
    """Keys, shapes and dtypes of the weights, against those SGLang builds from config.json."""
    expected = expected_tensors(cfg)
    with safe_open(str(path), framework="pt") as f:
        shapes = {key: _shape_and_dtype(f.get_slice(key)) for key in f.keys()}
    problems = _key_set_problems(path.name, set(shapes), set(expected))
    for key in sorted(set(expected) & set(shapes)):
        shape, dtype = shapes[key]
        if shape != expected[key]:
            problems.append(f"{path.name}: {key} has shape {shape}, expected {expected[key]}")
        if _dtype_name(dtype) != declared:
            problems.append(
                f"{path.name}: {key} is {_dtype_name(dtype)}, config.json declares {declared}"
            )
    return problems


def _shape_and_dtype(tensor_slice) -> tuple[tuple[int, ...], str]:
    return tuple(tensor_slice.get_shape()), tensor_slice.get_dtype()


def _dtype_name(safetensors_dtype: str) -> str:
    return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(
        safetensors_dtype, safetensors_dtype
    )
