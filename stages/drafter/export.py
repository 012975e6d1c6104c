"""Write the drafter as SGLang's `LlamaForCausalLMEagle3` checkpoint, and prove it loads right.

SGLang and vLLM both load this format (vLLM registers the same architecture name) and both
silently skip unknown or missing keys, ignore a wrong layer id and replace a null
`draft_vocab_size` by the full vocabulary. So the exporter checks every field, key, shape and
layer id the engines rely on itself, on the temporary directory, before the checkpoint is renamed
into place.

One config.json serves both engines: SGLang reads the layer ids from
`eagle_config.eagle_aux_hidden_state_layer_ids`, vLLM from the top-level
`eagle_aux_hidden_state_layer_ids`, each written in its own convention (see layers.py). The SGLang
ids serve every known SGLang version unless a version is named (`sglang_version`), which some aux
indices of DeepSeek-family targets need; the check then covers that version only. A separate
vLLM speculators-format config is not written: vLLM runs this one with the same forward as long as
`norm_before_residual` is false, which is written explicitly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ..runtime.files import atomic_path
from .layers import (
    parse_version,
    serving_layer_ids,
    sglang_captured_indices,
    vllm_captured_indices,
)
from .model import (
    Eagle3Config,
    Eagle3Drafter,
    LayerShape,
    TargetFacts,
    rope_fields,
    rope_serving_problem,
    target_facts,
)
from .serving_dtype import declared_dtype, export_dtype, sglang_dtype_problem

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TRAINING_ARGS_FILE = "training_args.json"
PROJECT_KEY = "eagle_pipeline"  # what the checkpoint was trained on, for people and checks
ARCHITECTURE = "LlamaForCausalLMEagle3"
ENGINE_NUM_AUX = 3  # both engines build fc for exactly 3 captured layers


class ExportError(ValueError):
    """An exported drafter that the serving engines would load wrongly."""


def expected_tensors(cfg: Eagle3Config) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Key -> (shape, dtype) of the checkpoint; dtype None means any floating type."""
    H, I, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    floats = {
        "fc.weight": (H, cfg.num_aux * cfg.target_hidden_size),
        "midlayer.input_layernorm.weight": (H,),
        "midlayer.hidden_norm.weight": (H,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * H),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * H),
        "midlayer.self_attn.o_proj.weight": (H, q),
        "midlayer.post_attention_layernorm.weight": (H,),
        "midlayer.mlp.gate_proj.weight": (I, H),
        "midlayer.mlp.up_proj.weight": (I, H),
        "midlayer.mlp.down_proj.weight": (H, I),
        "norm.weight": (H,),
        "lm_head.weight": (cfg.draft_vocab_size, H),
    }
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {
        key: (shape, None) for key, shape in floats.items()
    }
    tensors["d2t"] = ((cfg.draft_vocab_size,), torch.int64)
    tensors["t2d"] = ((cfg.vocab_size,), torch.bool)
    return tensors


def serving_config(
    cfg: Eagle3Config, target_config: Any, *, sglang_version: str | None = None
) -> dict:
    """config.json: the SGLang / vLLM fields, plus what the checkpoint was trained on. The dtype
    is the target's (serving_dtype.py says why); the SGLang layer ids serve every known SGLang
    version, or `sglang_version` only when one is named."""
    target = target_facts(target_config)
    ids = serving_layer_ids(
        target.architecture,
        list(cfg.aux_layer_ids),
        target.num_hidden_layers,
        sglang_version=sglang_version,
    )
    dtype_name = declared_dtype(target_config)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": 1,
        **layer_config(cfg, cfg.rope_scaling, cfg.hidden_act),
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "norm_before_residual": False,
        "torch_dtype": dtype_name,
        "dtype": dtype_name,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": ids["sglang"],
            "use_aux_hidden_state": True,
        },
        "eagle_aux_hidden_state_layer_ids": ids["vllm"],
        PROJECT_KEY: {
            "aux_hidden_state_hf_indices": list(cfg.aux_layer_ids),
            "target_architecture": target.architecture,
            "target_num_hidden_layers": target.num_hidden_layers,
            "target_hidden_size": target.hidden_size,
            "target_vocab_size": target.vocab_size,
            "target_max_position_embeddings": target.max_position_embeddings,
            "sglang_version": sglang_version,  # the layer ids' SGLang; None: every version
        },
    }


def layer_config(cfg: LayerShape, rope_scaling: dict | None, hidden_act: str) -> dict:
    """The config.json keys of a draft layer's shapes and rope, as both drafter families write
    them (rope in both layouts: `rope_theta` + `rope_scaling`, and transformers 5's
    `rope_parameters`)."""
    return {
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": {
            "rope_type": "default",
            **(rope_scaling or {}),
            "rope_theta": cfg.rope_theta,
        },
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
    }


def config_from_json(config: dict) -> Eagle3Config:
    """The drafter's shapes as the serving engines read them from config.json."""
    theta, scaling = rope_fields(config)
    return Eagle3Config(
        hidden_size=config["hidden_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config["head_dim"],
        intermediate_size=config["intermediate_size"],
        rms_norm_eps=config["rms_norm_eps"],
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=config["max_position_embeddings"],
        vocab_size=config["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"],
        target_hidden_size=config["target_hidden_size"],
        aux_layer_ids=config[PROJECT_KEY]["aux_hidden_state_hf_indices"],
        num_aux=len(config[PROJECT_KEY]["aux_hidden_state_hf_indices"]),
        hidden_act=config["hidden_act"],
    )


def export_drafter(
    drafter: Eagle3Drafter,
    cfg: Eagle3Config,
    out_dir: Path | str,
    target_config: Any,
    extra: dict,
    *,
    sglang_version: str | None = None,
) -> Path:
    """Write config.json, model.safetensors (in the target's dtype) and training_args.json
    (`extra`); check the result before renaming it into place. `sglang_version` (e.g. "0.5.12"):
    the SGLang that will serve the drafter, for aux indices no single id list serves on every
    version; None: every version."""
    if drafter.cfg != cfg:
        raise ValueError("export_drafter: cfg differs from the drafter's own config")
    try:
        training_args = json.dumps(extra, indent=2) + "\n"
    except TypeError as e:
        raise ValueError(f"export_drafter: `extra` must be JSON-serialisable ({e})") from e
    return write_checkpoint(
        drafter,
        out_dir,
        target_config,
        serving_config(cfg, target_config, sglang_version=sglang_version),
        lambda tmp: check_export(
            tmp, target_config, list(cfg.aux_layer_ids), sglang_version=sglang_version
        ),
        {TRAINING_ARGS_FILE: training_args},
    )


def write_checkpoint(
    drafter: nn.Module,
    out_dir: Path | str,
    target_config: Any,
    config: dict,
    check: Callable[[Path], None],
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write config.json, model.safetensors (floating tensors in the target's dtype) and
    `extra_files` (name -> text) into a temporary folder, which `check` must pass before it is
    renamed into `out_dir`: a checkpoint that would load wrongly never stands there."""
    dtype = export_dtype(target_config)
    state = {
        k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
        for k, v in drafter.state_dict().items()
    }
    out_dir = Path(out_dir)
    size = sum(t.numel() * t.element_size() for t in state.values())
    with atomic_path(out_dir, size) as tmp:
        tmp.mkdir()
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        check(tmp)
    return out_dir


def check_export(
    out_dir: Path | str,
    target_config: Any,
    trained_hf_indices: list[int],
    *,
    sglang_version: str | None = None,
) -> None:
    """Raise ExportError listing everything an engine would load wrongly from `out_dir`: among
    them, layer ids that make vLLM, or SGLang at `sglang_version` (None: at any known version),
    capture other hidden states than `trained_hf_indices`."""
    out_dir = Path(out_dir)
    config = read_exported_config(out_dir)
    target = target_facts(target_config)
    problems = _field_problems(config, target_config, target, sglang_version)
    problems += _layer_id_problems(
        config, target, [int(i) for i in trained_hf_indices], sglang_version
    )
    try:
        cfg = config_from_json(config)
    except (KeyError, TypeError, ValueError) as e:
        problems.append(f"config.json cannot be read as a draft config: {e!r}")
    else:
        problems += _weight_problems(out_dir / WEIGHTS_FILE, cfg, declared_dtype(config))
    if problems:
        raise ExportError(
            f"{out_dir} would load wrongly in the serving engines:\n  - " + "\n  - ".join(problems)
        )


def read_exported_config(out_dir: Path) -> dict:
    """config.json of an exported drafter (either family), after checking that both files
    exist."""
    missing_files = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (out_dir / f).exists()]
    if missing_files:
        raise ExportError(f"{out_dir}: missing {', '.join(missing_files)}")
    return json.loads((out_dir / CONFIG_FILE).read_text())


def check_exported(out_dir: Path | str, target_config: Any) -> None:
    """check_export for a drafter read back from disk alone: the trained layers and the SGLang
    version it was written for are taken from its config.json."""
    out_dir = Path(out_dir)
    path = out_dir / CONFIG_FILE
    if not path.exists():
        raise ExportError(f"{out_dir}: missing {CONFIG_FILE}; is it an exported drafter?")
    try:
        project = json.loads(path.read_text()).get(PROJECT_KEY) or {}
        trained = [int(i) for i in project["aux_hidden_state_hf_indices"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ExportError(
            f"{path}: no {PROJECT_KEY}.aux_hidden_state_hf_indices ({e!r}); not exported by "
            f"this project, or damaged"
        ) from None
    check_export(out_dir, target_config, trained, sglang_version=project.get("sglang_version"))


def _field_problems(
    config: dict, target_config: Any, target: TargetFacts, sglang_version: str | None
) -> list[str]:
    """The config.json fields the engines read or silently replace, against the target's."""
    dtype = sglang_dtype_problem(config, target_config)
    expect = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "norm_before_residual": False,
        "hidden_act": "silu",
        "vocab_size": target.vocab_size,
        "target_hidden_size": target.hidden_size,
    }
    problems = [
        f"config.json: {key} is {config.get(key)!r}, expected {value!r}"
        for key, value in expect.items()
        if config.get(key) != value
    ]
    if config.get("hidden_size") != target.hidden_size:
        problems.append(
            f"config.json: hidden_size {config.get('hidden_size')} differs from the "
            f"target's {target.hidden_size}; the draft has no embed_tokens and SGLang "
            f"shares the target's embedding only at equal widths"
        )
    if not isinstance(config.get("draft_vocab_size"), int):
        problems.append(
            f"config.json: draft_vocab_size is {config.get('draft_vocab_size')!r}; "
            f"null makes SGLang drop the trained lm_head"
        )
    max_pos = config.get("max_position_embeddings") or 0
    if max_pos < target.max_position_embeddings:
        problems.append(
            f"config.json: max_position_embeddings {max_pos} is below the target's "
            f"{target.max_position_embeddings}; positions past it get no rotary "
            f"angles at serving time"
        )
    rope = rope_serving_problem(
        rope_fields(config)[1], parse_version(sglang_version) if sglang_version else None
    )
    if rope:
        problems.append(f"config.json: {rope}")
    if (config.get("eagle_config") or {}).get("use_aux_hidden_state") is not True:
        problems.append("config.json: eagle_config.use_aux_hidden_state must be true")
    return problems + [f"config.json: {p}" for p in [dtype] if p]


def _layer_id_problems(
    config: dict, target: TargetFacts, trained: list[int], sglang_version: str | None
) -> list[str]:
    """Whether each engine, reading its layer ids from config.json, captures the hidden states
    the drafter was trained on: a wrong id loads without a word and only drafts worse."""
    problems = []
    if len(trained) != ENGINE_NUM_AUX:
        problems.append(
            f"trained on {len(trained)} target layers; the engines feed exactly {ENGINE_NUM_AUX}"
        )
    recorded = (config.get(PROJECT_KEY) or {}).get("aux_hidden_state_hf_indices")
    if recorded != trained:
        problems.append(
            f"config.json: {PROJECT_KEY}.aux_hidden_state_hf_indices is {recorded}, "
            f"trained on {trained}"
        )
    problems += _sglang_id_problems(config, target, trained, sglang_version)
    vllm_ids = config.get("eagle_aux_hidden_state_layer_ids")
    vllm = vllm_captured_indices(vllm_ids, target.num_hidden_layers)
    if vllm != trained:
        problems.append(
            f"config.json: eagle_aux_hidden_state_layer_ids {vllm_ids} make vLLM "
            f"capture HF hidden states {vllm}, trained on {trained}"
        )
    return problems


def _sglang_id_problems(
    config: dict, target: TargetFacts, trained: list[int], sglang_version: str | None
) -> list[str]:
    """The SGLang ids' check, at `sglang_version` or at every known version (which must all
    capture alike); hints at the version the ids were written for when none is named."""
    sglang_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    versions = f"version {sglang_version}" if sglang_version else "every known version"
    written_for = (config.get(PROJECT_KEY) or {}).get("sglang_version")
    hint = (
        f" (written for SGLang {written_for}: check with sglang_version={written_for!r})"
        if written_for and not sglang_version
        else ""
    )
    try:
        # the same table serving_layer_ids wrote them by; raises when versions capture differently
        sglang = sglang_captured_indices(
            target.architecture, sglang_ids, target.num_hidden_layers, sglang_version
        )
    except ValueError as e:
        return [
            f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids: {e}; "
            f"trained on {trained}{hint}"
        ]
    if sglang != trained:
        return [
            f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids "
            f"{sglang_ids} make SGLang capture HF hidden states {sglang} of "
            f"{target.architecture} ({versions}), trained on {trained}{hint}"
        ]
    return []


def _weight_problems(path: Path, cfg: Eagle3Config, declared: str) -> list[str]:
    """Keys, shapes and dtypes of the weights: the float ones in the dtype config.json declares
    (an engine casts them to it, so weights in another dtype are not what was checked)."""
    expected = expected_tensors(cfg)
    with safe_open(str(path), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    problems = []
    for key in sorted(tensors):
        if key.startswith("model."):
            problems.append(f"{path.name}: key {key} has a `model.` prefix (vLLM adds it itself)")
        if "embed_tokens" in key:
            problems.append(
                f"{path.name}: key {key}: the draft must not carry an embedding, the "
                f"engines use the target's"
            )
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"{path.name}: missing keys {missing}")
    if unexpected:
        problems.append(f"{path.name}: unexpected keys {unexpected}")
    for key in sorted(set(expected) & set(tensors)):
        shape, dtype = expected[key]
        t = tensors[key]
        if tuple(t.shape) != shape:
            problems.append(f"{path.name}: {key} has shape {tuple(t.shape)}, expected {shape}")
        if dtype is None and str(t.dtype).removeprefix("torch.") != declared:
            problems.append(f"{path.name}: {key} is {t.dtype}, config.json declares {declared}")
        if dtype is not None and t.dtype != dtype:
            problems.append(f"{path.name}: {key} is {t.dtype}, expected {dtype}")
    if not problems:
        problems += _vocab_problems(path.name, tensors["d2t"], tensors["t2d"])
    return problems


def _vocab_problems(name: str, d2t: torch.Tensor, t2d: torch.Tensor) -> list[str]:
    ids = torch.arange(d2t.numel()) + d2t
    if ids.min() < 0 or ids.max() >= t2d.numel():
        return [f"{name}: d2t maps draft ids outside the target vocabulary"]
    if not torch.equal(t2d.nonzero().flatten(), ids):
        return [f"{name}: t2d does not mark exactly the target ids i + d2t[i], ascending"]
    return []


def load_drafter(out_dir: Path | str) -> tuple[Eagle3Drafter, Eagle3Config]:
    """Rebuild the drafter from the exported files alone."""
    out_dir = Path(out_dir)
    cfg = config_from_json(json.loads((out_dir / CONFIG_FILE).read_text()))
    state = load_file(str(out_dir / WEIGHTS_FILE))
    drafter = Eagle3Drafter(cfg).to(state["fc.weight"].dtype)
    drafter.load_state_dict(state, strict=True)
    return drafter, cfg
