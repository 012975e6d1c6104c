"""An upgrade extracts nothing again: a rerun keeps the shards when the facts in meta.json
equal this run's, whatever formula hashed them into the shards' key; a meta.json from before the
facts were recorded by the key of that time's formula; only a changed fact extracts again."""

import json

import pytest

from stages import extract as stage
from stages.params.extract import ExtractParams
from tests.conftest import STORIES_REL
from tests.stages.test_extract_train import LAYERS, TARGET, merged

pytestmark = pytest.mark.shared(STORIES_REL)

PARAMS = ExtractParams(layers=LAYERS, shard_tokens=40, batch_tokens=200, dtype="float32")


def stamps(hidden):
    return {p.name: p.stat().st_mtime_ns for p in sorted(hidden.glob("shard-*.safetensors"))}


def meta(hidden) -> dict:
    return json.loads((hidden / "meta.json").read_text())


def test_shards_from_before_the_facts_are_kept_then_carry_them(tmp_path, monkeypatch):
    """Extracted as the stage did before meta.json recorded its facts (that formula's key, no
    extracted_by): the rerun extracts nothing and records the facts under the same key."""
    m, out = merged(tmp_path, n_train=4, n_eval=1), tmp_path / "hidden"
    with monkeypatch.context() as old:
        old.setattr(
            stage, "_fingerprint", lambda _, p, t, i: (stage._legacy_fingerprint(p, t, i), None)
        )
        stage.extract(m, out, PARAMS, TARGET)
    before, written = stamps(out), meta(out)
    assert "extracted_by" not in written and len(before) > 1
    report = stage.extract(m, out, PARAMS, TARGET)
    assert report.extracted_tokens == 0 and stamps(out) == before
    assert meta(out)["fingerprint"] == written["fingerprint"]
    assert meta(out)["extracted_by"]["layers"] == LAYERS


def test_equal_facts_after_a_key_formula_change_keep_the_shards(tmp_path, monkeypatch):
    m, out = merged(tmp_path, n_train=4, n_eval=1), tmp_path / "hidden"
    stage.extract(m, out, PARAMS, TARGET)
    before, key = stamps(out), meta(out)["fingerprint"]
    monkeypatch.setattr(stage, "_facts_key", lambda facts: "another-formula")
    report = stage.extract(m, out, PARAMS, TARGET)
    assert report.extracted_tokens == 0 and stamps(out) == before
    assert meta(out)["fingerprint"] == key
    wider = ExtractParams(layers=[0, 1, 2], shard_tokens=40, batch_tokens=200, dtype="float32")
    redone = stage.extract(m, out, wider, TARGET)  # a changed fact: extracted again
    assert redone.extracted_tokens == redone.tokens
    assert meta(out)["fingerprint"] == "another-formula"
