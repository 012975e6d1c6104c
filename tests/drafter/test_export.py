import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from stages.drafter.export import ExportError, check_export, export_drafter, load_drafter
from stages.drafter.model import Eagle3Config, Eagle3Drafter

from .conftest import HIDDEN, make_drafter, tiny_target_config


@pytest.fixture
def exported(tmp_path, drafter, target_config):
    out = export_drafter(
        drafter, drafter.cfg, tmp_path / "drafter", target_config, {"lr": 1e-4, "ttt_steps": 7}
    )
    return out


def test_config_carries_what_both_engines_read(exported):
    config = json.loads((exported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["draft_vocab_size"] == 120 and config["vocab_size"] == 300
    assert config["target_hidden_size"] == HIDDEN and config["norm_before_residual"] is False
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 3, 4],
        "use_aux_hidden_state": True,
    }
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert config["eagle_pipeline"]["aux_hidden_state_hf_indices"] == [2, 4, 5]
    assert json.loads((exported / "training_args.json").read_text())["ttt_steps"] == 7
    assert not list(exported.parent.glob(".*tmp*"))


def test_round_trip_gives_equal_weights_and_outputs(exported, drafter):
    loaded, cfg = load_drafter(exported)
    assert cfg == drafter.cfg
    for key, value in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    embeds, aux = torch.randn(1, 5, HIDDEN), torch.randn(1, 5, 3 * HIDDEN)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.step(embeds, aux).logits, drafter.step(embeds, aux).logits
        )


@pytest.mark.parametrize("declared", ["bfloat16", "float16", "float32"])
def test_the_drafter_is_written_in_its_targets_dtype(tmp_path, drafter, declared):
    """A float32-trained drafter exported for a target that declares `declared`: weights and
    config in that dtype, so SGLang's --dtype auto runs both alike."""
    target = tiny_target_config(dtype=declared)
    out = export_drafter(drafter, drafter.cfg, tmp_path / declared, target, {})
    loaded, _ = load_drafter(out)
    assert loaded.fc.weight.dtype == getattr(torch, declared) and loaded.d2t.dtype == torch.int64
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == config["dtype"] == declared
    torch.testing.assert_close(loaded.fc.weight.float(), drafter.fc.weight, rtol=1e-2, atol=1e-2)


def test_a_float32_drafter_beside_a_bf16_target_is_refused(tmp_path, drafter):
    """What crashed SGLang 0.5.14 at its first request: config.json saying float32 for a bf16
    target (SGLang's auto rule runs it in float16)."""
    target = tiny_target_config(dtype="bfloat16")
    out = export_drafter(drafter, drafter.cfg, tmp_path / "d", target, {})
    check_export(out, target, [2, 4, 5])
    edit_config(out, torch_dtype="float32", dtype="float32")
    edit_weights(
        out, lambda s: s.update({k: v.float() for k, v in s.items() if v.is_floating_point()})
    )
    with pytest.raises(
        ExportError, match="run the drafter in float16, beside the target in bfloat16"
    ):
        check_export(out, target, [2, 4, 5])


def test_weights_in_another_dtype_than_the_config_are_refused(tmp_path, drafter):
    target = tiny_target_config(dtype="bfloat16")
    out = export_drafter(drafter, drafter.cfg, tmp_path / "d", target, {})
    edit_weights(out, lambda s: s.update({"norm.weight": s["norm.weight"].float()}))
    with pytest.raises(
        ExportError, match="norm.weight is torch.float32, config.json declares bfloat16"
    ):
        check_export(out, target, [2, 4, 5])


def edit_config(out, **changes):
    config = json.loads((out / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key)
        else:
            config[key] = value
    (out / "config.json").write_text(json.dumps(config))


def edit_weights(out, change):
    state = load_file(str(out / "model.safetensors"))
    change(state)
    save_file(state, str(out / "model.safetensors"))


_DROP = object()
BAD_CONFIGS = [
    (dict(draft_vocab_size=None), "draft_vocab_size is None"),
    (dict(target_hidden_size=None), "target_hidden_size is None"),
    (dict(max_position_embeddings=128), "max_position_embeddings 128 is below"),
    (
        dict(
            eagle_config={
                "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
                "use_aux_hidden_state": True,
            }
        ),
        r"SGLang capture HF hidden states \[3, 5, 6\]",
    ),
    (
        dict(eagle_aux_hidden_state_layer_ids=[1, 3, 4]),
        r"vLLM capture HF hidden states \[1, 3, 4\]",
    ),
    (dict(norm_before_residual=_DROP), "norm_before_residual is None"),
    (dict(architectures=["LlamaForCausalLM"]), "architectures"),
    (dict(num_hidden_layers=2), "num_hidden_layers is 2"),
    (dict(tie_word_embeddings=True), "tie_word_embeddings"),
]


@pytest.mark.parametrize("changes, message", BAD_CONFIGS)
def test_bad_configs_are_rejected(exported, target_config, changes, message):
    check_export(exported, target_config, [2, 4, 5])
    edit_config(exported, **changes)
    with pytest.raises(ExportError, match=message):
        check_export(exported, target_config, [2, 4, 5])


def test_trained_indices_must_match_the_recorded_ones(exported, target_config):
    with pytest.raises(ExportError, match="trained on \\[2, 4, 6\\]"):
        check_export(exported, target_config, [2, 4, 6])


def _rename(old, new):
    def change(state):
        state[new] = state.pop(old)

    return change


BAD_WEIGHTS = [
    (lambda s: s.pop("midlayer.hidden_norm.weight"), r"missing keys \['midlayer.hidden_norm"),
    (
        lambda s: s.update({"embed_tokens.weight": torch.zeros(300, HIDDEN)}),
        "must not carry an embedding",
    ),
    (_rename("fc.weight", "model.fc.weight"), "has a `model.` prefix"),
    (
        lambda s: s.update({"lm_head.weight": torch.zeros(300, HIDDEN)}),
        r"lm_head.weight has shape \(300, 64\), expected \(120, 64\)",
    ),
    (lambda s: s.update({"d2t": s["d2t"].int()}), "d2t is torch.int32, expected torch.int64"),
    (lambda s: s.update({"t2d": s["t2d"].to(torch.uint8)}), "t2d is torch.uint8"),
    (lambda s: s.update({"t2d": s["t2d"].roll(1)}), "t2d does not mark exactly"),
    (
        lambda s: s.update(
            {"midlayer.mlp.up_proj.weight": s["midlayer.mlp.up_proj.weight"].long()}
        ),
        "up_proj.weight is torch.int64, config.json declares float32",
    ),
]


@pytest.mark.parametrize("change, message", BAD_WEIGHTS)
def test_bad_weights_are_rejected(exported, target_config, change, message):
    edit_weights(exported, change)
    with pytest.raises(ExportError, match=message):
        check_export(exported, target_config, [2, 4, 5])


def test_export_refuses_to_publish_a_bad_checkpoint(tmp_path, target_config):
    cfg = dataclasses.replace(
        Eagle3Config.from_target(target_config, 120, [2, 4, 5]), max_position_embeddings=128
    )
    with pytest.raises(ExportError, match="max_position_embeddings"):
        export_drafter(Eagle3Drafter(cfg), cfg, tmp_path / "bad", target_config, {})
    assert list(tmp_path.iterdir()) == []


def test_hidden_size_must_equal_the_targets(tmp_path):
    target = tiny_target_config()
    drafter = make_drafter(target)
    wider = tiny_target_config(hidden_size=2 * HIDDEN)
    with pytest.raises(ExportError, match="hidden_size 64 differs from the target's 128"):
        export_drafter(drafter, drafter.cfg, tmp_path / "x", wider, {})
