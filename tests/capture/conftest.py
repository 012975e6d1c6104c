"""The tiny random targets (a Llama and a DeepSeek-V3) the capture tests run, saved as local HF
checkpoints; merged samples over their vocabulary; and the stand-ins of SGLang's releases made
importable in this process (`fake`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, LlamaConfig, LlamaForCausalLM

from tests import fake_sglang

VOCAB = 128
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=8)
CONFIGS = {
    "llama": lambda: LlamaConfig(
        **SMALL, num_attention_heads=4, num_key_value_heads=2, architectures=["LlamaForCausalLM"]
    ),
    "deepseek": lambda: DeepseekV3Config(
        **SMALL,
        moe_intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        moe_layer_freq=1,  # what SGLang's DeepSeek model reads, transformers has no default for
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        architectures=["DeepseekV3ForCausalLM"],
    ),
}
CLASSES = {"llama": LlamaForCausalLM, "deepseek": DeepseekV3ForCausalLM}


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """The tiny random checkpoints, saved as local HF directories."""
    out = {}
    for family, make in CONFIGS.items():
        torch.manual_seed(0)
        model = CLASSES[family](make()).eval()
        path = tmp_path_factory.mktemp(family)
        model.save_pretrained(path)
        out[family] = path
    return out


def write_merged(out: Path, n_train: int = 7, n_eval: int = 3, vocab: int = VOCAB) -> Path:
    g = torch.Generator().manual_seed(0)
    out.mkdir(parents=True)
    for split, n in (("train", n_train), ("eval", n_eval)):
        rows = []
        for i in range(n):
            length = 9 + 7 * ((i * 5) % 7)
            ids = torch.randint(3, vocab, (length,), generator=g).tolist()
            rows.append(
                dict(
                    sample_id=f"{split}/{i}",
                    dataset="d",
                    input_ids=ids,
                    loss_spans=[[2, length]],
                    length=length,
                    truncated=False,
                    split=split,
                )
            )
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    return out


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """activate(version, package): the stand-in of release `package` (default: `version`)
    importable as a fresh process would see it, the installed distribution reporting `version`;
    returns fake_core, whose RECORD lasts the test. Call it before each engine is built: 0.5.23
    builds its parallel groups once per process."""

    active: list[str] = []

    def activate(version: str = "0.5.23", package: str | None = None):
        key = f"{version}/{package}"
        if active[-1:] != [key]:
            where = fake_sglang.write_distribution(tmp_path / f"dist-{version}", version)
            monkeypatch.syspath_prepend(str(where))
            monkeypatch.syspath_prepend(str(fake_sglang.ROOT))
            monkeypatch.syspath_prepend(str(fake_sglang.stand_in(package or version)))
            fake_sglang.forget()
            active.append(key)
        for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
            del sys.modules[name]
        import fake_core

        return fake_core

    yield activate
    fake_sglang.forget()
