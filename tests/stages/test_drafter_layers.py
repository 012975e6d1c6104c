"""The features hold the union of the layers the chosen drafter families read, captured once:
meta.json and reports/extract.json say which layers each family reads and what the ones only it
reads cost; each training stage reads its own layers back, equal to the target's own hidden
states at those indices."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from stages.artifacts.hidden import HiddenStates, read_meta
from stages.cli import StageError
from stages.extract import extract
from stages.params.dflash import DFlashParams
from stages.params.extract import ExtractParams
from stages.params.target import TargetParams
from stages.reports.extract import DrafterLayers
from stages.runtime.errors import ParamsError
from tests.conftest import DEMO_TARGET
from tests.runtime.test_distributed import write_merged

TARGET = TargetParams(path=str(DEMO_TARGET), device="cpu", dtype="float32", cpu_threads=1)
HIDDEN = 128  # the demo target's width; 8 layers


def extracted(tmp, drafters, dflash: DFlashParams, layers=None):
    params = ExtractParams(
        drafters=drafters, layers=layers, shard_tokens=120, batch_tokens=256, dtype="float32"
    )
    out = tmp / "hidden"
    report = extract(write_merged(tmp / "merged"), out, params, TARGET, dflash=dflash)
    return out, report


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """EAGLE-3 at its default [2, 4, 5], DFlash with two draft layers at SGLang's default ids
    [1, 5] (HF [2, 6]): one layer shared, one only DFlash reads."""
    return extracted(
        tmp_path_factory.mktemp("both"), ["eagle3", "dflash"], DFlashParams(num_layers=2)
    )


def test_the_union_is_captured_once_and_each_family_recorded(both):
    hidden, report = both
    meta = read_meta(hidden)
    assert meta.aux_hf_indices == [2, 4, 5, 6]
    assert meta.drafter_layers == {"eagle3": [2, 4, 5], "dflash": [2, 6]}
    assert json.loads((hidden / "meta.json").read_text())["drafter_layers"]["dflash"] == [2, 6]
    assert report.drafters == {
        "eagle3": DrafterLayers([2, 4, 5], [4, 5], 2 * HIDDEN * 4, 2 * 7168 * 4),
        "dflash": DrafterLayers([2, 6], [6], HIDDEN * 4, 7168 * 4),
    }
    assert report.bytes_per_token_all == (4 + 1) * HIDDEN * 4  # four aux layers and the last


def test_each_family_reads_the_targets_own_states_at_its_layers(both):
    """Read back through a family's layers, aux is the target's hidden_states at those indices,
    computed here by transformers itself."""
    hidden, _ = both
    model = AutoModelForCausalLM.from_pretrained(DEMO_TARGET, dtype=torch.float32)
    for layers in ([2, 6], [2, 4, 5]):
        sample = HiddenStates(hidden, "train", layers=layers)[0]
        with torch.no_grad():
            states = model(sample["input_ids"].long()[None], output_hidden_states=True)
        want = torch.cat([states.hidden_states[i][0] for i in layers], dim=-1)
        torch.testing.assert_close(sample["aux"], want, rtol=1e-4, atol=1e-4)


def test_layers_that_were_not_captured_are_refused_naming_the_fix(both):
    hidden, _ = both
    with pytest.raises(ValueError, match=r"meta.json: HF hidden states \[3\].*extract.drafters"):
        HiddenStates(hidden, "train", layers=[3])


def test_features_for_eagle3_alone_are_those_of_before(tmp_path):
    """extract.drafters [eagle3] (the default): the layers and the shards' key a run had before
    the families existed, so an upgrade extracts nothing again."""
    hidden, report = extracted(tmp_path, ["eagle3"], DFlashParams(num_layers=2))
    meta = read_meta(hidden)
    assert meta.aux_hf_indices == [2, 4, 5] and meta.drafter_layers == {"eagle3": [2, 4, 5]}
    assert meta.extracted_by["layers"] == [2, 4, 5]
    assert report.drafters["eagle3"].only_it_reads == [2, 4, 5]


def test_dflash_ids_are_checked_against_the_target(tmp_path):
    with pytest.raises(StageError, match=r"dflash.target_layer_ids: ids \[7\] are outside 0 .. 6"):
        extracted(tmp_path, ["eagle3", "dflash"], DFlashParams(target_layer_ids=[3, 7]))
    with pytest.raises(ParamsError, match="ascending"):
        DFlashParams(target_layer_ids=[5, 3])


def test_eagle3_is_always_trained():
    with pytest.raises(ParamsError, match="eagle3 among them"):
        ExtractParams(drafters=["dflash"])
