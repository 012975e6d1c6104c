"""A random DeepSeek-V3 target built in code, shaped like Kimi-K2.5's language model: multi-head
latent attention (q_lora_rank, kv_lora_rank, qk_nope / qk_rope / v head dims), MoE with routed
experts and a shared expert after `first_k_dense_replace` dense layers, and Kimi's yarn RoPE. Its
config carries the MoE keys of a real DeepSeek-V3 / Kimi-K2 config.json (KIMI_MOE), which
SGLang's DeepSeek model code reads and transformers' DeepseekV3Config lacks or defaults otherwise.

`tiny` runs on the CPU in tests (tests/target_model/test_deepseek_target.py); its head widths
(kv_lora_rank 16, qk_rope_head_dim 8) crash real SGLang's MLA kernels on a GPU. `kimi-heads` has
Kimi-K2.5's head dims at a size one GPU loads in seconds (`kimi_heads_target`, for real SGLang on
a GPU); `kimi-k2.5` has Kimi-K2.5's widths with fewer layers and experts
(tests/perf/bench_kimi_width.py, on a GPU).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

DEMO_TARGET = Path(__file__).resolve().parents[1] / "data" / "demo" / "target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Kimi-K2.5's text_config rope: yarn over 4,096 original positions, mscale = mscale_all_dim = 1
# (so the cos/sin magnitude is 1.0, and SGLang before 0.5.16 would serve 1.416).
KIMI_YARN = {
    "type": "yarn",
    "factor": 64.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
KIMI_ROPE = dict(rope_theta=50000.0, max_position_embeddings=262144, rope_scaling=KIMI_YARN)

# Kimi-K2.5's MoE keys, as every real DeepSeek-V3 / Kimi-K2 config.json has them (DeepSeek-V3:
# first_k_dense_replace 3, n_group 8, topk_group 4, routed_scaling_factor 2.5, one MTP layer).
# SGLang's models/deepseek_v2.py reads them as `config.<key>` (fake_core.DEEPSEEK_MOE_KEYS);
# transformers' DeepseekV3Config has no moe_layer_freq, topk_method, scoring_func or ep_size of
# its own, keeps them as given and writes them to config.json.
KIMI_MOE = dict(
    n_shared_experts=1,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    n_group=1,
    topk_group=1,
    routed_scaling_factor=2.827,
    ep_size=1,
    num_nextn_predict_layers=0,
)

# Kimi-K2.5's attention: 64 heads, its q / kv LoRA ranks and head dims (what real SGLang's MLA
# kernels take).
KIMI_HEADS = dict(
    num_attention_heads=64,
    num_key_value_heads=64,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
)
KIMI = dict(rms_norm_eps=1e-5, **KIMI_MOE, **KIMI_ROPE)

SHAPES: dict[str, dict] = {
    # Kimi-K2.5's widths; its 61 layers and 384 experts are cut to what one GPU holds.
    "kimi-k2.5": dict(
        hidden_size=7168,
        vocab_size=163840,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=6,
        n_routed_experts=16,
        num_experts_per_tok=8,
        **KIMI_HEADS,
        **KIMI,
    ),
    # The same structure at CPU-test size. 8 layers: the default aux indices [2, N//2, N-3] =
    # [2, 4, 5] start at 2, as Kimi's [2, 30, 58] do (3 ascending indices starting at 2 need
    # at least 5 layers).
    "tiny": dict(
        hidden_size=64,
        vocab_size=2048,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        num_hidden_layers=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        **KIMI,
    ),
    # Kimi-K2.5's attention and MoE keys at hidden 1024 with 8 routed experts: about 0.4B
    # parameters, 0.8 GB in bf16. 8 layers, as tiny's, so the default aux indices are [2, 4, 5];
    # vocab_size is the demo tokenizer's in kimi_heads_target.
    "kimi-heads": dict(
        hidden_size=1024,
        vocab_size=2048,
        intermediate_size=4096,
        moe_intermediate_size=512,
        num_hidden_layers=8,
        n_routed_experts=8,
        num_experts_per_tok=2,
        **KIMI_HEADS,
        **KIMI,
    ),
}


def deepseek_config(shape: str = "tiny", **overrides) -> DeepseekV3Config:
    values = {**SHAPES[shape], **overrides}
    values["rope_scaling"] = dict(values["rope_scaling"])
    return DeepseekV3Config(**values, architectures=["DeepseekV3ForCausalLM"])


def build_target(
    cfg: DeepseekV3Config,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> DeepseekV3ForCausalLM:
    """Random weights (HF's initialisation, std 0.02), made directly on `device` in `dtype`."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = DeepseekV3ForCausalLM._from_config(cfg, dtype=dtype)
    return model.eval()


def save_target(
    model: DeepseekV3ForCausalLM,
    out: Path,
    tokenizer_dir: Path | None = DEMO_TARGET,
    max_shard_size: str | int = "50GB",
) -> Path:
    """save_pretrained (safetensors; sharded with an index when over `max_shard_size`), plus the
    tokenizer files of `tokenizer_dir` (the demo target's: Kimi's special tokens and a Kimi-like
    chat template)."""
    model.save_pretrained(out, max_shard_size=max_shard_size)
    for name in TOKENIZER_FILES if tokenizer_dir else ():
        shutil.copy(Path(tokenizer_dir) / name, Path(out) / name)
    return Path(out)


def demo_tokens() -> dict:
    """The demo tokenizer's vocabulary size and special token ids, as config values."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(DEMO_TARGET)
    return dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def tiny_target(out: Path, **overrides) -> Path:
    """The tiny DeepSeek-V3 target with the demo tokenizer, its vocab_size the tokenizer's."""
    cfg = deepseek_config("tiny", **{**demo_tokens(), **overrides})
    return save_target(build_target(cfg), out, max_shard_size="300KB")


def kimi_heads_target(out: Path, **overrides) -> Path:
    """The kimi-heads DeepSeek-V3 target in bf16 (config.json's dtype "bfloat16", as a real
    checkpoint's) with the demo tokenizer, its vocab_size the tokenizer's: for real SGLang on a
    GPU."""
    cfg = deepseek_config("kimi-heads", **{**demo_tokens(), **overrides})
    return save_target(build_target(cfg, dtype=torch.bfloat16), out, max_shard_size="500MB")


def tiny_vision_config(text_hidden_size: int) -> dict:
    """A one-layer MoonViT vision tower and its projector, with every key SGLang's
    KimiK25VisionConfig takes and its MoonViT and projector read (the tower under both its own
    names and Kimi-K2.5's `vt_` ones, as the real config.json has the latter): what SGLang
    builds beside the language model; its weights are not in the checkpoint (the capture never
    runs the tower)."""
    tower = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_hidden_layers=1)
    return {
        **tower,
        **{f"vt_{key}": value for key, value in tower.items()},
        "patch_size": 14,
        "init_pos_emb_height": 8,
        "init_pos_emb_width": 8,
        "init_pos_emb_time": 4,
        "pos_emb_type": "divided_fixed",
        "merge_kernel_size": [2, 2],
        "video_attn_type": "spatial_temporal",
        "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmerger",
        "mm_hidden_size": tower["hidden_size"],
        "projector_hidden_act": "gelu",
        "projector_ln_eps": 1e-5,
        "text_hidden_size": text_hidden_size,
    }


def k25_layout(src: Path, out: Path) -> Path:
    """The weights of an HF DeepSeek-V3 checkpoint in Kimi-K2.5's layout: a multimodal wrapper
    config (`KimiK25ForConditionalGeneration`, the language model under `text_config`) and every
    key under `language_model.`, sharded with an index. Not loadable by transformers (Kimi's
    wrapper is remote code); what the stages read from it without loading: config and tensors."""
    out.mkdir(parents=True)
    text = json.loads((src / "config.json").read_text())
    text["model_type"] = "kimi_k2"
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": tiny_vision_config(int(text["hidden_size"])),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weight_map: dict[str, str] = {}
    files = sorted(src.glob("model*.safetensors"))
    for k, path in enumerate(files):
        name = f"model-{k + 1:05d}-of-{len(files):05d}.safetensors"
        with safe_open(str(path), "pt") as f:
            tensors = {f"language_model.{key}": f.get_tensor(key) for key in f.keys()}
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2)
    )
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    return out
