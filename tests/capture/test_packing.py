"""Samples packed into rows (stages/capture/packing.py) give each sample's features as a forward of
its own: rotary positions restart at every sample and attention stays inside it, for a Llama
with llama3 rope scaling, a DeepSeek-V3 (MLA: value heads narrower than the query's, yarn) and a
Mistral with a sliding window (transformers' own mask from the packed positions), in fp32 on the
CPU; and compiled once, no row length compiles again."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from transformers import (
    DeepseekV3ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from stages.capture.hf import HFCapture
from stages.capture.hooks import FeatureExtractor
from stages.capture.packing import PACKED, PackedRow, packed_rows, warm_up_row
from tests.mla_target import deepseek_config

SMALL = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=8)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
TARGETS = {
    "llama": lambda: LlamaForCausalLM(
        LlamaConfig(
            **SMALL, num_attention_heads=4, num_key_value_heads=2, rope_parameters=LLAMA3_ROPE
        )
    ),
    "deepseek": lambda: DeepseekV3ForCausalLM(deepseek_config("tiny")),  # MLA, Kimi's yarn
    "mistral": lambda: MistralForCausalLM(
        MistralConfig(**SMALL, num_attention_heads=4, num_key_value_heads=2, sliding_window=8)
    ),
}
AUX = [2, 4, 5]
LENGTHS = (6, 40, 27, 2, 33, 70, 5)  # rows of 64 tokens: [6, 40], [27, 2, 33], [70], [5]


def target(family: str):
    torch.manual_seed(0)
    return TARGETS[family]().eval()


def samples(lengths=LENGTHS) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, SMALL["vocab_size"], (n,), generator=g).tolist() for n in lengths]


reference_models = {family: target(family) for family in TARGETS}


def alone(family: str, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's own (aux, last) of one sample run by itself, positions from 0, on a model of its own
    (the capture's model is switched to packed attention)."""
    with torch.no_grad():
        states = reference_models[family](
            input_ids=torch.tensor([ids]), output_hidden_states=True
        ).hidden_states
    return torch.cat([states[i][0] for i in AUX], dim=-1), states[-1][0]


def test_packed_rows_are_consecutive_samples_within_the_budget():
    assert packed_rows(LENGTHS, 64) == [range(0, 2), range(2, 5), range(5, 6), range(6, 7)]
    assert packed_rows([10] * 5, 100) == [range(0, 5)] and packed_rows([], 100) == []


def test_a_row_restarts_positions_at_every_sample():
    row = PackedRow.of([[5, 6, 7], [8, 9], [4]])
    assert row.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert row.cu_seq_lens.tolist() == [0, 3, 5, 6] and row.cu_seq_lens.dtype == torch.int32
    assert row.spans == [(0, 3), (3, 5), (5, 6)] and row.max_length == 3
    sizes = warm_up_row(8192)
    assert sizes.input_ids.shape[1] == 8193 and sizes.lengths == (5462, 2731)


@pytest.mark.parametrize("family", list(TARGETS))
def test_each_packed_sample_is_its_own_forward(family):
    model = target(family)
    capture = HFCapture(model, AUX, torch.float32, batch_tokens=64)
    expected = PACKED if family != "mistral" else "sdpa"  # sliding window: transformers' mask
    assert model.config._attn_implementation == expected
    batch = samples()
    seen = []
    for pos, aux, last in capture.capture(batch):
        seen.append(pos)
        want_aux, want_last = alone(family, batch[pos])
        torch.testing.assert_close(aux, want_aux, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(last, want_last, atol=1e-5, rtol=1e-5)
    assert sorted(seen) == list(range(len(batch)))


def test_a_row_read_as_one_sequence_gives_other_features():
    """The comparison above can fail: the same row as one sequence (positions running on, no
    document mask) lets the second sample attend to the first."""
    model = target("llama")
    row = PackedRow.of(samples((20, 30)))
    _, last = FeatureExtractor(model, AUX)(row.input_ids, torch.ones_like(row.input_ids))
    _, want = alone("llama", samples((20, 30))[1])
    assert (last[0, 20:] - want).abs().max() > 1e-2


def test_a_packed_model_refuses_a_padded_batch():
    model = target("llama")
    extractor = HFCapture(model, AUX, torch.float32, batch_tokens=64).extractor
    assert isinstance(extractor, FeatureExtractor)
    ids = torch.tensor([samples((6,))[0]] * 2)
    with pytest.raises(ValueError, match=r"PackedRow.inputs\(\), not a padded batch"):
        extractor(ids, torch.ones_like(ids))


@pytest.mark.slow
def test_compiled_capture_compiles_once_for_every_row_length():
    """Each decoder layer compiled with dynamic shapes on a warm-up row: rows of other lengths and
    sample counts (a lone sample, one of 2 tokens) run the same graph, with the same features."""
    model = target("llama")
    capture = HFCapture(model, AUX, torch.float32, batch_tokens=64, compile=True)
    counters.clear()
    list(capture.capture([]))  # the warm-up row alone
    assert counters["stats"]["unique_graphs"] == 1
    batch = samples()
    for chunk in (batch, batch[::-1], batch[3:4], batch[5:6]):
        for pos, aux, last in capture.capture(chunk):
            want_aux, want_last = alone("llama", chunk[pos])
            torch.testing.assert_close(aux, want_aux, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(last, want_last, atol=1e-4, rtol=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["recompiles"] and not counters["graph_break"]
