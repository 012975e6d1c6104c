"""The draft layer for MLA targets (Kimi-K2.5, DeepSeek-V3); soft labels at a 163,840 vocabulary.

The configs are shaped like the published ones (Kimi-K2.5 nests its language model in
`text_config`); the drafters are built on the meta device, so the 7168-wide shapes cost nothing.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import DeepseekV3Config

from stages.drafter.export import expected_tensors
from stages.drafter.model import Eagle3Config, Eagle3Drafter, rope_magnitude, target_facts
from stages.drafter.ttt import soft_labels

from .conftest import HIDDEN, VOCAB, make_drafter, tiny_target_config

MLA = dict(
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    moe_intermediate_size=2048,
    first_k_dense_replace=1,
    n_shared_experts=1,
    num_experts_per_tok=8,
)
KIMI_YARN = {
    "type": "yarn",
    "factor": 64.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"],
    "model_type": "kimi_k25",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        **MLA,
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "vocab_size": 163840,
        "intermediate_size": 18432,
        "n_routed_experts": 384,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "max_position_embeddings": 262144,
        "rope_scaling": KIMI_YARN,
    },
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    **MLA,
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "vocab_size": 129280,
    "intermediate_size": 18432,
    "n_routed_experts": 256,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 163840,
    "rope_scaling": {**KIMI_YARN, "factor": 40.0},
}
AUX = [2, 30, 58]


def on_meta(cfg: Eagle3Config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in Eagle3Drafter(cfg).state_dict().items()}


def test_kimi_k25_draft_layer_has_the_published_shapes():
    cfg = Eagle3Config.from_target(KIMI_K25, 32000, AUX)
    # hidden 7168, 64 heads, 64 kv heads, head_dim 128, intermediate 18432 (SpecForge's drafter).
    assert (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    ) == (7168, 64, 64, 128, 18432)
    assert (
        cfg.vocab_size,
        cfg.target_hidden_size,
        cfg.max_position_embeddings,
        cfg.rms_norm_eps,
    ) == (163840, 7168, 262144, 1e-5)
    assert cfg.rope_theta == 50000.0
    assert cfg.rope_scaling == {
        "rope_type": "yarn",
        **{k: v for k, v in KIMI_YARN.items() if k != "type"},
    }
    assert rope_magnitude(cfg.rope_scaling) == 1.0
    shapes = on_meta(cfg)
    assert shapes == {key: shape for key, (shape, _) in expected_tensors(cfg).items()}
    assert shapes["midlayer.self_attn.q_proj.weight"] == (8192, 2 * 7168)
    assert shapes["midlayer.mlp.down_proj.weight"] == (7168, 18432)
    assert shapes["t2d"] == (163840,)
    facts = target_facts(KIMI_K25)
    assert (
        facts.architecture,
        facts.num_hidden_layers,
        facts.head_dim,
        facts.num_key_value_heads,
    ) == ("KimiK25ForConditionalGeneration", 61, 128, 64)


def test_deepseek_v3_dict_and_config_object_agree():
    from_dict = Eagle3Config.from_target(DEEPSEEK_V3, 32000, AUX)
    assert (
        from_dict.num_attention_heads,
        from_dict.num_key_value_heads,
        from_dict.head_dim,
        from_dict.intermediate_size,
        from_dict.vocab_size,
    ) == (128, 128, 128, 18432, 129280)
    assert from_dict.rope_scaling["factor"] == 40.0 and from_dict.rope_theta == 10000.0
    # transformers' DeepseekV3Config sets head_dim to the 64-wide rotary slice: not the draft's.
    values = {k: v for k, v in DEEPSEEK_V3.items() if k not in ("architectures", "model_type")}
    obj = DeepseekV3Config(**copy.deepcopy(values), architectures=["DeepseekV3ForCausalLM"])
    assert obj.head_dim == 64
    assert Eagle3Config.from_target(obj, 32000, AUX) == from_dict


def test_mla_defaults_give_way_to_overrides():
    cfg = Eagle3Config.from_target(
        KIMI_K25,
        32000,
        AUX,
        head_dim=64,
        num_key_value_heads=8,
        intermediate_size=12288,
        max_position_embeddings=524288,
    )
    assert (
        cfg.head_dim,
        cfg.num_key_value_heads,
        cfg.intermediate_size,
        cfg.max_position_embeddings,
    ) == (64, 8, 12288, 524288)


def test_mla_target_without_v_head_dim_is_refused():
    text = {k: v for k, v in KIMI_K25["text_config"].items() if k != "v_head_dim"}
    with pytest.raises(ValueError, match="`v_head_dim` is missing"):
        Eagle3Config.from_target({**KIMI_K25, "text_config": text}, 32000, AUX)


def test_draft_max_position_below_the_targets_is_refused():
    with pytest.raises(
        ValueError,
        match=r"max_position_embeddings 131072 is below the target's "
        r"262144.*at least 262144",
    ):
        Eagle3Config.from_target(KIMI_K25, 32000, AUX, max_position_embeddings=131072)


@pytest.mark.parametrize(
    "target, head_dim, kv_heads",
    [
        (tiny_target_config(), 16, 2),  # hidden // heads
        (tiny_target_config(head_dim=32), 32, 2),  # an explicit head_dim (Qwen3-like)
        (
            {**tiny_target_config().to_dict(), "head_dim": None, "num_key_value_heads": None},
            16,
            4,
        ),  # a dict without either
    ],
)
def test_llama_targets_keep_their_own_attention_shape(target, head_dim, kv_heads):
    cfg = Eagle3Config.from_target(target, 120, [2, 4, 5])
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.num_attention_heads) == (
        head_dim,
        kv_heads,
        4,
    )
    assert (cfg.intermediate_size, cfg.max_position_embeddings) == (128, 256)


# --- soft labels: chunked by tokens, whatever the batch size ---------------------------------


def unchunked(last, drafter, head=None):
    """The labels computed on the whole batch at once (what chunking must reproduce)."""
    logits = (last if head is None else last @ head.to(last.dtype).T).float()
    restricted = logits[..., drafter.draft_ids()]
    return restricted.softmax(-1), restricted.argmax(-1), drafter.t2d[logits.argmax(-1)]


@pytest.mark.parametrize("chunk", [1, 2, 4, 1 << 20])
def test_soft_labels_do_not_depend_on_the_chunk(target_config, chunk):
    drafter = make_drafter(target_config)
    torch.manual_seed(0)
    logits, hidden = torch.randn(3, 7, VOCAB) * 4, torch.randn(3, 7, HIDDEN)
    head = torch.randn(VOCAB, HIDDEN) / HIDDEN**0.5
    for labels, expected in [
        (soft_labels(logits, drafter, chunk=chunk), unchunked(logits, drafter)),
        (soft_labels(hidden, drafter, head, chunk=chunk), unchunked(hidden, drafter, head)),
    ]:
        assert labels.probs.shape == (3, 7, drafter.cfg.draft_vocab_size)
        torch.testing.assert_close(labels.probs, expected[0], rtol=1e-6, atol=1e-7)
        assert torch.equal(labels.argmax, expected[1])
        assert torch.equal(labels.in_vocab, expected[2])


class LargestVocabTensor(TorchDispatchMode):
    """Rows of the largest tensor with a last dimension of `vocab` that any op allocates (views of
    existing tensors, such as the input's chunks, allocate nothing)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.rows = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                    self.rows = max(self.rows, t.numel() // self.vocab)
        return out


@pytest.mark.parametrize("from_logits", [True, False])
def test_full_vocabulary_tensors_stay_chunk_sized(target_config, from_logits):
    drafter = make_drafter(target_config)
    batch, positions, chunk = 3, 7, 4
    head = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16)
    last = (
        torch.randn(batch, positions, VOCAB, dtype=torch.bfloat16)
        if from_logits
        else torch.randn(batch, positions, HIDDEN, dtype=torch.bfloat16)
    )
    with LargestVocabTensor(VOCAB) as largest:
        labels = soft_labels(last, drafter, None if from_logits else head, chunk=chunk)
    # bf16 logits and their fp32 copy: one chunk of one sample at a time, never batch * chunk.
    assert largest.rows == chunk
    assert labels.argmax.shape == (batch, positions)
    expected = unchunked(last, drafter, None if from_logits else head)
    assert torch.equal(labels.argmax, expected[1]) and torch.equal(labels.in_vocab, expected[2])
    assert F.kl_div(labels.probs.log(), expected[0], reduction="sum") < 1e-4
