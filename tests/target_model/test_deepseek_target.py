"""A Kimi-K2.5-shaped target (DeepSeek-V3: MLA, MoE with a shared expert, Kimi's yarn RoPE) through
the library and through the real `dvc repro`, on a tiny random model built here
(tests/mla_target.py) with the demo target's tokenizer (Kimi's special tokens and template)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import save_file
from transformers import AutoConfig

from stages import train as train_stage
from stages import vocab as vocab_stage
from stages.artifacts.hidden import HiddenMeta, HiddenStates
from stages.artifacts.merged import COLUMNS, iter_rows, split_path
from stages.capture.hooks import FeatureExtractor, decoder_parts
from stages.drafter.export import check_export
from stages.drafter.layers import serving_layer_ids
from stages.drafter.model import Eagle3Config, target_facts
from stages.target_model.model import load_causal_lm
from stages.target_model.weights import embedding_and_head
from tests.mla_target import (
    KIMI_YARN,
    SHAPES,
    deepseek_config,
    k25_layout,
    kimi_heads_target,
    tiny_target,
)
from tests.project import copy_project, ran_stages, sh
from tests.stage_runner import run_stage

AUX = [2, 4, 5]  # the default [2, N//2, N-3] of the tiny target's 8 layers
TINY = SHAPES["tiny"]
SGLANG_VERSION = "0.5.16"
STAGE_OUTPUTS = {  # what each stage of the pipeline writes, relative to the project
    "check": ["reports/check.json"],
    "prep@opencodeinstruct": ["data/prompts/opencodeinstruct.parquet"],
    "prep@sharegpt": ["data/prompts/sharegpt.parquet"],
    "generate@opencodeinstruct": [
        "data/raw/opencodeinstruct",
        "reports/generate/opencodeinstruct.json",
    ],
    "generate@sharegpt": ["data/raw/sharegpt", "reports/generate/sharegpt.json"],
    "merge": ["data/merged/train.parquet", "data/merged/eval.parquet", "reports/merge.json"],
    "quality": ["reports/quality.json", "reports/quality.md"],
    "vocab": ["data/vocab/d2t_t2d.safetensors", "reports/vocab.json"],
    "extract": ["data/hidden/index.parquet", "data/hidden/meta.json", "reports/extract.json"],
    "train": [
        "models/drafter/config.json",
        "models/drafter/model.safetensors",
        "reports/train.json",
    ],
    "train_dflash": [
        "models/dflash/config.json",
        "models/dflash/model.safetensors",
        "reports/train_dflash.json",
    ],
    "benchmark": ["reports/benchmark.json"],
    "benchmark_dflash": ["reports/benchmark_dflash.json"],
    "report": [
        "reports/index.html",
        "reports/metrics.json",
        "reports/metrics_notes.json",
        "models/card/README.md",
    ],
}


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("deepseek") / "target")


def hf_reference(model, ids: torch.Tensor, mask: torch.Tensor):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)


def test_target_is_kimi_shaped(target):
    cfg = AutoConfig.from_pretrained(target, local_files_only=True)
    assert cfg.model_type == "deepseek_v3" and cfg.num_hidden_layers == 8
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim) == (
        32,
        16,
        8,
        16,
    )
    assert (cfg.n_routed_experts, cfg.n_shared_experts, cfg.first_k_dense_replace) == (4, 1, 1)
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 64.0
    assert cfg.vocab_size == 2048  # the demo tokenizer's
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1  # sharded, as a real target is
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in index  # DeepSeek's expert layout
    assert "model.layers.1.mlp.shared_experts.up_proj.weight" in index


KIMI_HEADS = (
    "num_attention_heads",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)


def test_kimi_heads_has_kimi_k25s_attention_at_a_small_width():
    """What real SGLang's MLA kernels take on a GPU: Kimi-K2.5's heads, not tiny's."""
    cfg = deepseek_config("kimi-heads")
    assert {k: getattr(cfg, k) for k in KIMI_HEADS} == {
        k: SHAPES["kimi-k2.5"][k] for k in KIMI_HEADS
    }
    assert (cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (512, 64)
    assert cfg.hidden_size == 1024 and cfg.n_routed_experts == 8 and cfg.num_experts_per_tok == 2
    assert cfg.topk_method == "noaux_tc" and cfg.moe_layer_freq == 1


def test_kimi_heads_target_is_a_bf16_checkpoint_with_the_demo_tokenizer(tmp_path):
    """At a few layers and heads (the full shape is 0.8 GB): what the function writes."""
    small = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=2)
    out = kimi_heads_target(tmp_path / "target", **small)
    saved = json.loads((out / "config.json").read_text())
    assert saved["dtype"] == "bfloat16" and saved["vocab_size"] == TINY["vocab_size"]
    assert saved["kv_lora_rank"] == 512 and saved["qk_rope_head_dim"] == 64
    assert saved["moe_layer_freq"] == 1 and saved["topk_method"] == "noaux_tc"
    assert (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists()
    weights = embedding_and_head(out)
    assert all(w.dtype == torch.bfloat16 for w in weights)


def test_feature_extractor_equals_hf_hidden_states_exactly(target):
    """Hooks on DeepSeek-V3 decoder layers (MLA, MoE) capture hidden_states[i] and the post-norm
    final state, bit for bit in fp32, in a right-padded batch as capture_shard builds it."""
    model = load_causal_lm(str(target), device="cpu", dtype="float32")
    base, layers, norm = decoder_parts(model)
    assert base is model.model and len(layers) == 8 and norm is model.model.norm
    extractor = FeatureExtractor(model, AUX)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, TINY["vocab_size"], (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0  # right padding
    final: dict = {}
    layers[-1].register_forward_hook(lambda _m, _a, out: final.__setitem__("out", out))
    aux, last = extractor(ids, mask)
    pre_norm = final["out"]
    ref = hf_reference(model, ids, mask)
    assert len(ref.hidden_states) == 9
    H = TINY["hidden_size"]
    assert aux.shape == (2, 24, 3 * H) and last.shape == (2, 24, H)
    for j, i in enumerate(AUX):
        assert torch.equal(aux[..., j * H : (j + 1) * H], ref.hidden_states[i]), i
    assert torch.equal(last, ref.hidden_states[-1])
    with torch.no_grad():  # post-norm: the final norm of the last layer's output, the head's input
        assert torch.equal(last, norm(pre_norm))
        assert torch.equal(model.lm_head(last), ref.logits)


def test_k25_layout_gives_the_same_facts_tensors_and_layer_ids(target, tmp_path):
    """The same weights in Kimi-K2.5's layout (multimodal wrapper config, keys under
    `language_model.`): the draft shapes, the embedding / LM head and the layer ids agree."""
    k25 = k25_layout(target, tmp_path / "k25")
    plain_cfg = AutoConfig.from_pretrained(target, local_files_only=True)
    k25_cfg = AutoConfig.from_pretrained(k25, local_files_only=True)
    plain, wrapped = target_facts(plain_cfg), target_facts(k25_cfg)
    assert wrapped.architecture == "KimiK25ForConditionalGeneration"
    assert {**wrapped.__dict__, "architecture": None} == {**plain.__dict__, "architecture": None}
    assert Eagle3Config.from_target(k25_cfg, 256, AUX) == Eagle3Config.from_target(
        plain_cfg, 256, AUX
    )
    for got, want in zip(embedding_and_head(k25), embedding_and_head(target)):
        assert torch.equal(got, want)
    for arch in (plain.architecture, wrapped.architecture):
        ids = serving_layer_ids(arch, AUX, 8, sglang_version=SGLANG_VERSION)
        assert ids == {"sglang": [1, 3, 4], "vllm": [2, 4, 5]}


def test_vocab_stage_reads_the_vocabulary_size_of_a_k25_wrapper(
    target, tmp_path, monkeypatch, capsys
):
    """Kimi-K2.5's config nests the language model (vocab_size) in text_config."""
    k25 = k25_layout(target, tmp_path / "k25")
    merged = tmp_path / "merged"
    merged.mkdir()
    row = dict(
        sample_id="d/0",
        dataset="d",
        input_ids=[5, 6, 2047, 2047],
        loss_spans=[[1, 4]],
        length=4,
        truncated=False,
        split="train",
    )
    pq.write_table(pa.Table.from_pylist([row]).select(list(COLUMNS)), merged / "train.parquet")
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump({"target": {"path": str(k25)}, "vocab": {"draft_vocab_size": 256}})
    )
    args = ["--merged", merged, "--out", tmp_path / "d2t_t2d.safetensors"]
    args += ["--report", tmp_path / "vocab.json", "--params", params]
    code, _, err = run_stage(vocab_stage.main, args, monkeypatch, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "vocab.json").read_text())
    assert report["target_vocab_size"] == TINY["vocab_size"]
    assert report["supervised_tokens"] == 3 and report["coverage"] == 1.0


def test_train_refuses_kimi_yarn_without_a_serving_version(target, tmp_path, monkeypatch, capsys):
    """SGLang before 0.5.16 ignores yarn's mscale keys: with none named, train stops before any
    work, naming the param; rope: plain or a version from 0.5.16 on is what it asks for."""
    hidden_dir = tmp_path / "hidden"
    hidden_dir.mkdir()
    meta = HiddenMeta(
        fingerprint="x",
        target_path=str(target),
        architecture="DeepseekV3ForCausalLM",
        num_hidden_layers=TINY["num_hidden_layers"],
        hidden_size=TINY["hidden_size"],
        aux_hf_indices=AUX,
        dtype="float32",
        bytes_per_token=0,
    )
    (hidden_dir / "meta.json").write_text(json.dumps(meta.to_json()))
    vocab = tmp_path / "vocab.safetensors"
    used = torch.arange(256)
    t2d = torch.zeros(TINY["vocab_size"], dtype=torch.bool)
    t2d[used] = True
    save_file({"d2t": used - torch.arange(256), "t2d": t2d}, str(vocab))
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {"target": {"path": str(target)}, "train": {"sglang_version": None, "device": "cpu"}}
        )
    )
    args = [
        "--hidden-dir",
        hidden_dir,
        "--vocab-file",
        vocab,
        "--checkpoint-dir",
        tmp_path / "ckpt",
        "--out-dir",
        tmp_path / "drafter",
        "--report",
        tmp_path / "train.json",
        "--plots",
        tmp_path / "plots",
        "--params",
        params,
    ]
    code, _, err = run_stage(train_stage.main, args, monkeypatch, capsys)
    assert code == 1, err
    assert "train.sglang_version" in err and "0.5.16" in err and "rope: plain" in err, err
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "drafter").exists()


def deepseek_params(target: Path):
    def edit(p: dict) -> None:
        p["target"].update(path=str(target), cpu_threads=2)
        p["datasets"] = {
            name: {
                "prep": {
                    "format": fmt,
                    "path": f"data/demo/prompts/{file}",
                    "max_samples": 8,
                    "max_prompt_tokens": 1024,
                },
                "generate": {"budget_tokens": 10**6},
                "expect": {"reasoning": True},
            }
            for name, fmt, file in (
                ("opencodeinstruct", "opencodeinstruct", "opencodeinstruct.jsonl"),
                ("sharegpt", "sharegpt", "sharegpt.json"),
            )
        }
        p["generate"].update(max_new_tokens=24, batch_size=8)
        p["merge"].update(eval_fraction=0.4)  # eval prompts of both datasets to benchmark
        # A random model: reasoning rarely closes and replies run to max_new_tokens.
        p["quality"].update(
            min_reasoning_closed=0.0,
            max_empty_reasoning=1.0,
            max_truncated=1.0,
            max_unbalanced_tool_calls=1.0,
        )
        p["vocab"]["draft_vocab_size"] = 256
        p["extract"].update(dtype="float32", shard_tokens=2048)  # fp32: compared with HF below
        for family in ("train", "dflash"):  # both drafters, the same short run
            p[family].update(
                max_steps=6,
                batch_size=2,
                eval_every=3,
                checkpoint_every=3,
                eval_max_samples=4,
                sglang_version=SGLANG_VERSION,
            )
        p["train"]["ttt_steps"] = 3
        p["benchmark"].update(max_prompts=2, max_new_tokens=16, temperatures=[0.0])

    return edit


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(600)
def test_dvc_repro_with_a_deepseek_target(target, tmp_path):
    repo = copy_project(tmp_path / "project", deepseek_params(target))
    out = sh(["dvc", "repro"], repo)
    assert ran_stages(out.stdout) == set(STAGE_OUTPUTS), out.stdout
    for stage, paths in STAGE_OUTPUTS.items():
        for rel in paths:
            assert (repo / rel).exists(), f"{stage}: {rel} is missing"

    # extract: aux = HF hidden_states[i] at the recorded indices, last = the post-norm state
    meta = json.loads((repo / "data/hidden/meta.json").read_text())
    assert meta["aux_hf_indices"] == AUX and meta["architecture"] == "DeepseekV3ForCausalLM"
    model = load_causal_lm(str(target), device="cpu", dtype="float32")
    H = TINY["hidden_size"]
    for split in ("train", "eval"):
        data = HiddenStates(repo / "data/hidden", split)
        rows = {
            r["sample_id"]: r
            for r in iter_rows(split_path(repo / "data/merged", split), ["sample_id", "input_ids"])
        }
        assert len(data) == len(rows) > 0
        for i in range(min(3, len(data))):
            sample, ids = data[i], rows[data.rows[i]["sample_id"]]["input_ids"]
            assert sample["input_ids"].tolist() == ids
            ref = hf_reference(
                model, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long)
            )
            for j, index in enumerate(AUX):
                torch.testing.assert_close(
                    sample["aux"][:, j * H : (j + 1) * H], ref.hidden_states[index][0]
                )
            torch.testing.assert_close(sample["last"], ref.hidden_states[-1][0])

    # train: the exported drafter as SGLang (>= 0.5.16) and vLLM must load it
    drafter = json.loads((repo / "models/drafter/config.json").read_text())
    assert drafter["architectures"] == ["LlamaForCausalLMEagle3"]
    assert drafter["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in AUX]
    assert drafter["eagle_aux_hidden_state_layer_ids"] == AUX
    assert drafter["rope_scaling"] == {
        "rope_type": "yarn",
        **{k: v for k, v in KIMI_YARN.items() if k != "type"},
    }
    assert drafter["rope_theta"] == 50000.0 and drafter["max_position_embeddings"] == 262144
    assert drafter["head_dim"] == TINY["v_head_dim"]
    assert drafter["num_key_value_heads"] == drafter["num_attention_heads"] == 4
    assert drafter["hidden_size"] == drafter["target_hidden_size"] == H
    assert drafter["eagle_pipeline"]["sglang_version"] == SGLANG_VERSION
    check_export(
        repo / "models/drafter",
        AutoConfig.from_pretrained(target, local_files_only=True),
        AUX,
        sglang_version=SGLANG_VERSION,
    )
    train = json.loads((repo / "reports/train.json").read_text())
    assert train["steps"] == 6 and train["best_replayed_tau"] is not None

    # the same weights in Kimi-K2.5's layout (wrapper config, keys under `language_model.`):
    # the train stage reads its config and embedding / LM head shards, exports for kimi_k25
    k25 = k25_layout(target, tmp_path / "k25")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params["target"]["path"] = str(k25)
    (tmp_path / "k25.yaml").write_text(yaml.safe_dump(params))
    k25_out = tmp_path / "k25-run"
    sh(
        [
            "python",
            "-m",
            "stages.train",
            "--hidden-dir",
            "data/hidden",
            "--vocab-file",
            "data/vocab/d2t_t2d.safetensors",
            "--checkpoint-dir",
            str(k25_out / "checkpoints"),
            "--out-dir",
            str(k25_out / "drafter"),
            "--report",
            str(k25_out / "train.json"),
            "--plots",
            str(k25_out / "plots"),
            "--params",
            str(tmp_path / "k25.yaml"),
        ],
        repo,
    )
    wrapped = json.loads((k25_out / "drafter/config.json").read_text())
    assert wrapped["eagle_pipeline"]["target_architecture"] == "KimiK25ForConditionalGeneration"
    assert wrapped["eagle_config"] == drafter["eagle_config"]
    assert wrapped["eagle_aux_hidden_state_layer_ids"] == AUX
    same = ("hidden_size", "head_dim", "intermediate_size", "rope_scaling", "vocab_size")
    assert {k: wrapped[k] for k in same} == {k: drafter[k] for k in same}

    # benchmark: the target and the exported drafter, decoding in-process
    bench = json.loads((repo / "reports/benchmark.json").read_text())
    assert bench["tau_greedy"] >= 1.0
    greedy = bench["temperatures"]["0.0"]["datasets"]
    assert set(greedy) <= {"opencodeinstruct", "sharegpt"} and greedy
    for report in greedy.values():  # lossless at temperature 0
        assert report["outputs_equal_baseline"] == report["prompts"] > 0
