"""Layer ids that make every serving engine capture the trained HF hidden states, on every
SGLang version the table knows (or the one named), and an export check that catches wrong ones."""

import json

import pytest
import torch

from stages.drafter.export import ExportError, check_export, export_drafter
from stages.drafter.layers import (
    CAPTURE_TABLE,
    SGLANG,
    parse_version,
    serving_layer_ids,
    sglang_captured_by_version,
    sglang_captured_indices,
    sglang_conventions,
    vllm_captured_indices,
)
from stages.drafter.model import Eagle3Config, Eagle3Drafter
from stages.drafter.vocab import build_draft_vocab

from .conftest import DRAFT_VOCAB, LAYERS, tiny_target_config

VERSIONS = ["0.5.6", "0.5.12", "0.5.13", "0.5.23"]
LLAMA_FAMILY = ["LlamaForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"]
DEEPSEEK_FAMILY = ["DeepseekV3ForCausalLM", "KimiK2ForCausalLM", "KimiK25ForConditionalGeneration"]
K25 = "KimiK25ForConditionalGeneration"


def engine_capture(architecture, ids, num_layers, version):
    """What the engines' model code does with the ids, written out independently of the table:
    SGLang llama.py: id + 1; deepseek_v2.py: id + 1 up to 0.5.12, from 0.5.13 id + 1 only when
    the first id is 1; the Kimi-K2.5 wrapper passes ids on only from 0.5.10. None: no capture."""
    v = tuple(int(x) for x in version.split("."))
    if architecture == K25 and v < (0, 5, 10):
        return None
    if ids is None:
        return [2, num_layers // 2, num_layers - 3]
    if architecture in LLAMA_FAMILY or v <= (0, 5, 12) or ids[0] == 1:
        return [i + 1 for i in ids]
    return list(ids)


def served(architecture, version):
    return engine_capture(architecture, None, 61, version) is not None


# (architectures, num_layers, trained HF indices, sglang version or None,
#  expected SGLang ids, or the message of the refusal)
CASES = [
    *[(a, 32, [2, 16, 29], v, [1, 15, 28]) for a in LLAMA_FAMILY for v in [None, *VERSIONS]],
    *[(a, 32, [1, 16, 29], v, [0, 15, 28]) for a in LLAMA_FAMILY for v in [None, *VERSIONS]],
    *[(a, 32, [3, 16, 31], v, [2, 15, 30]) for a in LLAMA_FAMILY for v in [None, *VERSIONS]],
    # Kimi / DeepSeek default: ids i - 1 start at 1, which every version shifts.
    *[
        (a, 61, [2, 30, 58], v, [1, 29, 57])
        for a in DEEPSEEK_FAMILY
        for v in [None, *VERSIONS]
        if v is None or served(a, v)
    ],
    *[(a, 61, [2, 30, 58], "0.5.6", "not passed on.*0.5.10 or later") for a in [K25]],
    # Starting at 3: the versions disagree, so a version must be named.
    *[
        (
            a,
            61,
            [3, 30, 58],
            None,
            r"no single SGLang id list.*needs ids \[2, 29, 57\].*needs ids \[3, 30, 58\].*"
            r"sglang_version=.*start the aux indices at 2",
        )
        for a in DEEPSEEK_FAMILY
    ],
    *[
        (a, 61, [3, 30, 58], v, [2, 29, 57] if v in ("0.5.6", "0.5.12") else [3, 30, 58])
        for a in DEEPSEEK_FAMILY
        for v in VERSIONS
        if served(a, v)
    ],
    # Index 1 first: only SGLang before 0.5.13 can capture it (ids starting with 0).
    *[
        (
            a,
            61,
            [1, 30, 58],
            None,
            r"no single SGLang id list.*needs ids \[0, 29, 57\].*"
            r"0.5.13 cannot capture them",
        )
        for a in DEEPSEEK_FAMILY
    ],
    *[(a, 61, [1, 30, 58], "0.5.12", [0, 29, 57]) for a in DEEPSEEK_FAMILY if a != K25],
    *[
        (a, 61, [1, 30, 58], v, "start the aux indices at 2")
        for a in DEEPSEEK_FAMILY
        for v in ["0.5.13", "0.5.23"]
    ],
]


@pytest.mark.parametrize("architecture, num_layers, hf, version, expected", CASES)
def test_written_ids_capture_the_trained_indices(architecture, num_layers, hf, version, expected):
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            serving_layer_ids(architecture, hf, num_layers, sglang_version=version)
        return
    ids = serving_layer_ids(architecture, hf, num_layers, sglang_version=version)
    assert ids == {"sglang": expected, "vllm": hf}
    assert vllm_captured_indices(ids["vllm"], num_layers) == hf
    # Every version the ids are meant for: the table's simulation and the engines' code agree.
    for v in [version] if version else VERSIONS:
        if not served(architecture, v):
            continue
        assert engine_capture(architecture, ids["sglang"], num_layers, v) == hf, v
        assert sglang_captured_indices(architecture, ids["sglang"], num_layers, v) == hf, v
    if version is None:
        assert sglang_captured_indices(architecture, ids["sglang"], num_layers) == hf


@pytest.mark.parametrize("architecture", [*LLAMA_FAMILY, *DEEPSEEK_FAMILY])
@pytest.mark.parametrize("version", VERSIONS + ["0.5.9", "0.5.10", "0.5.13.post1", "0.5.12rc1"])
@pytest.mark.parametrize("ids", [None, [1, 29, 57], [2, 30, 58], [3, 30, 58], [0, 29, 57]])
def test_the_table_simulates_the_engines_code(architecture, version, ids):
    expected = engine_capture(architecture, ids, 61, version.split("rc")[0].removesuffix(".post1"))
    if expected is None:
        with pytest.raises(ValueError, match="0.5.10 or later"):
            sglang_captured_indices(architecture, ids, 61, version)
    else:
        assert sglang_captured_indices(architecture, ids, 61, version) == expected


def test_what_the_old_writer_wrote_for_kimi_moves_on_old_sglang():
    """[2, 30, 58] (the HF indices themselves) is right only from SGLang 0.5.13."""
    by_version = sglang_captured_by_version("DeepseekV3ForCausalLM", [2, 30, 58], 61)
    assert by_version == {"SGLang < 0.5.13": [3, 31, 59], "SGLang >= 0.5.13": [2, 30, 58]}
    assert sglang_captured_by_version(K25, [2, 30, 58], 61) == {
        "SGLang >= 0.5.10, < 0.5.13": [3, 31, 59],
        "SGLang >= 0.5.13": [2, 30, 58],
    }
    with pytest.raises(ValueError, match=r"different HF hidden states.*\[3, 31, 59\]"):
        sglang_captured_indices("DeepseekV3ForCausalLM", [2, 30, 58], 61)
    for version, captured in [("0.5.12", [3, 31, 59]), ("0.5.13", [2, 30, 58])]:
        assert sglang_captured_indices("KimiK2ForCausalLM", [2, 30, 58], 61, version) == captured


def test_no_ids_written_is_the_default_capture_everywhere():
    for architecture in [*LLAMA_FAMILY, *DEEPSEEK_FAMILY]:
        assert sglang_captured_indices(architecture, None, 61) == [2, 30, 58]
    assert vllm_captured_indices(None, 61) == [2, 30, 58]


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "DeepseekV3ForCausalLM", K25])
@pytest.mark.parametrize(
    "hf, message",
    [
        ([2, 30, 61], r"1\.\.60"),  # index N: the final normed state, never an aux id
        ([0, 30, 58], r"1\.\.60"),  # the embedding output
        ([-1, 30, 58], r"1\.\.60"),
        ([2, 30, 70], r"1\.\.60"),
        ([2, 58, 30], "ascending"),
        ([2, 30, 30], "ascending"),
        ([], "ascending"),
    ],
)
def test_indices_the_engines_cannot_capture_are_refused(architecture, hf, message):
    for version in [None, *VERSIONS]:
        with pytest.raises(ValueError, match=message):
            serving_layer_ids(architecture, hf, 61, sglang_version=version)


def test_the_last_decoder_layers_input_is_allowed():
    ids = serving_layer_ids("DeepseekV3ForCausalLM", [2, 30, 60], 61)
    assert ids == {"sglang": [1, 29, 59], "vllm": [2, 30, 60]}


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "DeepseekV4ForCausalLM"])
def test_unknown_families_are_refused(architecture):
    with pytest.raises(ValueError, match="unknown SGLang layer-id convention"):
        serving_layer_ids(architecture, [2, 30, 58], 61)


def test_versions_compare_as_numbers_not_strings():
    assert parse_version("0.5.9") < parse_version("0.5.10") < parse_version("0.5.13")
    assert parse_version("0.5.13.post1") == parse_version("v0.5.13") == parse_version("0.5.13.0")
    with pytest.raises(ValueError, match="release number"):
        parse_version("latest")
    assert serving_layer_ids(K25, [3, 30, 58], 61, sglang_version="0.5.10")["sglang"] == [2, 29, 57]
    with pytest.raises(ValueError, match="0.5.10 or later"):
        serving_layer_ids(K25, [3, 30, 58], 61, sglang_version="0.5.9")


@pytest.mark.parametrize("family", sorted({c.family for c in CAPTURE_TABLE if c.engine == SGLANG}))
def test_each_family_has_exactly_one_rule_per_version(family):
    rows = [c for c in CAPTURE_TABLE if c.engine == SGLANG and c.family == family]
    for version in ["0.1", "0.5.0", *VERSIONS, "0.5.9", "0.5.10", "0.5.13", "1.0"]:
        assert sum(c.covers(version) for c in rows) == 1, (family, version)
    architecture = {
        "llama": "LlamaForCausalLM",
        "deepseek_v2": "DeepseekV3ForCausalLM",
        "kimi_k25": K25,
    }[family]
    assert {c.family for c in sglang_conventions(architecture)} == {family}


# --- the export writes these ids and its check catches wrong ones --------------------------------


def drafter_for(target_config, aux_indices):
    cfg = Eagle3Config.from_target(target_config, DRAFT_VOCAB, aux_indices)
    drafter = Eagle3Drafter(cfg)
    counts = torch.randint(0, 50, (cfg.vocab_size,), generator=torch.Generator().manual_seed(0))
    d2t, t2d, _ = build_draft_vocab(counts, DRAFT_VOCAB)
    drafter.set_vocab(d2t, t2d)
    return drafter.eval()


def plant_sglang_ids(out, ids):
    config = json.loads((out / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (out / "config.json").write_text(json.dumps(config))


def written_ids(out):
    config = json.loads((out / "config.json").read_text())
    return (
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
        config["eagle_aux_hidden_state_layer_ids"],
        config["eagle_pipeline"]["sglang_version"],
    )


@pytest.mark.parametrize("architecture", ["DeepseekV3ForCausalLM", K25])
def test_deepseek_export_writes_ids_every_sglang_reads_alike(tmp_path, architecture):
    target = tiny_target_config(architectures=[architecture])
    drafter = drafter_for(target, [2, 4, 5])
    out = export_drafter(drafter, drafter.cfg, tmp_path / "drafter", target, {})
    assert written_ids(out) == ([1, 3, 4], [2, 4, 5], None)
    for version in [None, *VERSIONS[1:]]:
        check_export(out, target, [2, 4, 5], sglang_version=version)


def test_a_planted_wrong_id_list_is_caught(tmp_path):
    target = tiny_target_config(architectures=["DeepseekV3ForCausalLM"])
    drafter = drafter_for(target, [2, 4, 5])
    out = export_drafter(drafter, drafter.cfg, tmp_path / "drafter", target, {})
    plant_sglang_ids(out, [2, 4, 5])  # the HF indices themselves: right only from 0.5.13
    with pytest.raises(
        ExportError,
        match=r"SGLang < 0.5.13: \[3, 5, 6\]; SGLang >= 0.5.13: "
        r"\[2, 4, 5\].*trained on \[2, 4, 5\]",
    ):
        check_export(out, target, [2, 4, 5])
    with pytest.raises(
        ExportError,
        match=r"capture HF hidden states \[3, 5, 6\] of "
        r"DeepseekV3ForCausalLM \(version 0.5.12\)",
    ):
        check_export(out, target, [2, 4, 5], sglang_version="0.5.12")
    check_export(out, target, [2, 4, 5], sglang_version="0.5.13")
    plant_sglang_ids(out, [1, 2, 3])  # read alike by every version, and wrong on all
    with pytest.raises(ExportError, match=r"capture HF hidden states \[2, 3, 4\].*every known"):
        check_export(out, target, [2, 4, 5])


def test_indices_needing_a_version_export_only_with_one(tmp_path):
    target = tiny_target_config(architectures=["DeepseekV3ForCausalLM"])
    drafter = drafter_for(target, [3, 4, 5])
    with pytest.raises(ValueError, match=r"needs ids \[2, 3, 4\].*needs ids \[3, 4, 5\]"):
        export_drafter(drafter, drafter.cfg, tmp_path / "none", target, {})
    assert list(tmp_path.iterdir()) == []
    for version, sglang in [("0.5.12", [2, 3, 4]), ("0.5.13", [3, 4, 5])]:
        out = export_drafter(
            drafter, drafter.cfg, tmp_path / version, target, {}, sglang_version=version
        )
        assert written_ids(out) == (sglang, [3, 4, 5], version)
        check_export(out, target, [3, 4, 5], sglang_version=version)
        other = "0.5.13" if version == "0.5.12" else "0.5.12"
        with pytest.raises(ExportError, match=f"version {other}"):
            check_export(out, target, [3, 4, 5], sglang_version=other)
        with pytest.raises(ExportError, match=f"written for SGLang {version}"):
            check_export(out, target, [3, 4, 5])


def test_llama_export_is_unchanged_by_a_version(tmp_path, target_config):
    assert LAYERS == 8
    drafter = drafter_for(target_config, [2, 4, 5])
    for version in [None, "0.5.6", "0.5.23"]:
        out = export_drafter(
            drafter, drafter.cfg, tmp_path / str(version), target_config, {}, sglang_version=version
        )
        assert written_ids(out) == ([1, 3, 4], [2, 4, 5], version)
