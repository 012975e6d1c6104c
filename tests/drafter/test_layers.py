import pytest

from stages.drafter.layers import (
    default_aux_indices,
    serving_layer_ids,
    sglang_captured_indices,
    vllm_captured_indices,
)


@pytest.mark.parametrize(
    "layers, hf, sglang", [(8, [2, 4, 5], [1, 3, 4]), (32, [2, 16, 29], [1, 15, 28])]
)
def test_llama_sglang_ids_are_one_below_the_hf_indices(layers, hf, sglang):
    assert default_aux_indices(layers) == hf
    ids = serving_layer_ids("LlamaForCausalLM", hf, layers)
    assert ids == {"sglang": sglang, "vllm": hf}
    assert sglang_captured_indices("LlamaForCausalLM", ids["sglang"], layers) == hf
    assert vllm_captured_indices(ids["vllm"], layers) == hf
    # The engines' own defaults (no ids written) capture the same default layers.
    assert sglang_captured_indices("LlamaForCausalLM", None, layers) == hf
    assert vllm_captured_indices(None, layers) == hf


def test_kimi_sglang_ids_are_one_below_the_hf_indices_on_every_version():
    hf = default_aux_indices(61)
    assert hf == [2, 30, 58]
    for arch in ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"):
        ids = serving_layer_ids(arch, hf, 61)
        assert ids == {"sglang": [1, 29, 57], "vllm": [2, 30, 58]}
        # The first id is 1, so SGLang shifts these ids for these targets on every version.
        assert sglang_captured_indices(arch, ids["sglang"], 61) == hf
        for version in ("0.5.12", "0.5.13"):
            assert sglang_captured_indices(arch, ids["sglang"], 61, version) == hf


def test_qwen_follows_llama():
    assert serving_layer_ids("Qwen3ForCausalLM", [2, 18, 33], 36)["sglang"] == [1, 17, 32]


@pytest.mark.parametrize(
    "hf, message",
    [([2, 2, 5], "ascending"), ([5, 3, 6], "ascending"), ([0, 3, 5], "1..7"), ([2, 4, 8], "1..7")],
)
def test_rejects_indices_the_engines_cannot_capture(hf, message):
    with pytest.raises(ValueError, match=message):
        serving_layer_ids("LlamaForCausalLM", hf, 8)


def test_kimi_cannot_start_at_index_one():
    with pytest.raises(ValueError, match="start the aux indices at 2"):
        serving_layer_ids("DeepseekV3ForCausalLM", [1, 30, 58], 61)


def test_unknown_architecture_and_too_few_layers():
    with pytest.raises(ValueError, match="unknown SGLang layer-id convention"):
        serving_layer_ids("GPT2LMHeadModel", [2, 4, 5], 8)
    with pytest.raises(ValueError, match="give the aux indices explicitly"):
        default_aux_indices(5)
