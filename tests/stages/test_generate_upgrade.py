"""An upgrade throws no raw data away: a rerun keeps a dataset's turns when the facts they were
generated under equal this run's, whatever formula hashed them into their fingerprint; rows
written before the facts were recorded are held to the formula of their time (the fixture holds
rows that commit wrote); only a changed fact starts the dataset over."""

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import transformers

from stages import generate
from stages.artifacts.raw import read_raw
from stages.engines import Sampling
from stages.engines.hf import HFEngine
from stages.generate import generate_dataset
from stages.params.generate import GenerateParams
from stages.target_model.model import load_causal_lm
from stages.wiring import generation
from tests.conftest import ROOT, STORIES, STORIES_REL
from tests.stages.test_generate import TARGET, Served, part_bytes

pytestmark = pytest.mark.shared(STORIES_REL)

BEFORE_FACTS = ROOT / "tests/fixtures/raw_before_facts"  # its README says how it was made
WRITTEN_UNDER = "5.24.0"  # the transformers version it was written under (a fact of its rows)


@pytest.fixture(scope="module")
def engine():
    return HFEngine(load_causal_lm(str(STORIES)), pad_id=0, batch_size=2)


@pytest.fixture
def prompts(tmp_path):
    """Eight prompts of the stories target, as tests/stages/test_generate.py's."""
    rows = pq.read_table(BEFORE_FACTS / "prompts.parquet").to_pylist()
    rows = [
        {**rows[0], "sample_id": f"d/{i}", "prompt_ids": [1, 300 + i, 400 + i]} for i in range(8)
    ]
    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture
def as_written(monkeypatch):
    """The transformers version the fixture's rows were written under: another one is a changed
    fact (it renders the chat template), which starts them over as it should."""
    monkeypatch.setattr(transformers, "__version__", WRITTEN_UNDER)


def gen_params(**kw) -> GenerateParams:
    return GenerateParams(max_new_tokens=4, append_every=2, batch_size=2, **kw)


def earlier_raw(tmp_path):
    out = tmp_path / "raw"
    shutil.copytree(BEFORE_FACTS / "raw", out)
    return out


def no_engine(monkeypatch):
    monkeypatch.setattr(generate, "make_engine", lambda *_: pytest.fail("an engine was built"))


@pytest.mark.parametrize("engine_name", ["hf", "sglang"])
def test_raw_data_from_before_the_facts_is_kept_at_the_same_params(
    tmp_path, as_written, monkeypatch, engine_name
):
    """The rerun after the upgrade generates nothing and leaves the raw data byte for byte."""
    out = earlier_raw(tmp_path)
    before = part_bytes(out)
    no_engine(monkeypatch)
    gen = gen_params(engine=engine_name)
    again = generate_dataset("d", BEFORE_FACTS / "prompts.parquet", out, gen, 10**6, TARGET)
    assert again.new_turns == 0 and again.samples == 3
    assert again.fingerprint == "7f379fdc0cca06cc"
    assert part_bytes(out) == before


def test_turns_added_to_raw_data_from_before_the_facts_are_kept_with_it(
    tmp_path, as_written, engine, monkeypatch
):
    """A new prompt's turns join the old rows (recording their facts); the next rerun keeps
    both, whether the engine's facts are known (hf) or a server is still to be asked."""
    out = earlier_raw(tmp_path)
    prompts = pq.read_table(BEFORE_FACTS / "prompts.parquet").to_pylist()
    prompts.append({**prompts[-1], "sample_id": "d/3", "prompt_ids": [1, 303, 403]})
    more = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(prompts), more)
    added = generate_dataset("d", more, out, gen_params(), 10**6, TARGET, engine)
    assert added.new_turns == 1 and added.samples == 4
    assert read_raw(out).column("generated_by").null_count == 3
    before = part_bytes(out)
    no_engine(monkeypatch)
    for name in ("hf", "sglang"):
        again = generate_dataset("d", more, out, gen_params(engine=name), 10**6, TARGET)
        assert again.new_turns == 0 and again.fingerprint == added.fingerprint
    assert part_bytes(out) == before


def test_a_changed_fact_starts_raw_data_from_before_the_facts_over(
    tmp_path, as_written, engine, capsys
):
    out = earlier_raw(tmp_path)
    hot = gen_params(temperature=0.8)
    redone = generate_dataset(
        "d", BEFORE_FACTS / "prompts.parquet", out, hot, 10**6, TARGET, engine
    )
    assert redone.new_turns == 3
    assert set(read_raw(out).column("fingerprint").to_pylist()) == {redone.fingerprint}
    said = capsys.readouterr().out
    assert "fingerprint 7f379fdc0cca06cc from before the facts were recorded" in said
    assert "the stage of commit 1f15548 writes" in said


def test_without_the_legacy_reader_the_rows_would_start_over(tmp_path, as_written, monkeypatch):
    """The rows are kept by the legacy reader alone: another formula in its place starts them
    over (what an upgrade without it did)."""
    out = earlier_raw(tmp_path)
    monkeypatch.setattr(generate, "legacy_fingerprint", lambda *_: "not-the-old-formula")
    monkeypatch.setattr(generate, "make_engine", lambda *_: pytest.fail("started over"))
    with pytest.raises(pytest.fail.Exception, match="started over"):
        generate_dataset("d", BEFORE_FACTS / "prompts.parquet", out, gen_params(), 10**6, TARGET)


@pytest.mark.parametrize("engine_name", ["hf", "sglang"])
def test_facts_equal_after_a_fingerprint_formula_change_keep_their_turns(
    tmp_path, prompts, engine, monkeypatch, engine_name
):
    """Turns generated, then the fingerprint's formula changed: the rerun keeps every turn and
    generates only the samples left, whether the facts are known before an engine starts (hf) or
    once a server answers."""
    out = tmp_path / "raw"
    gen = gen_params(engine=engine_name)
    served = Served(engine, "float32") if engine_name == "sglang" else engine
    first = generate_dataset("d", prompts, out, gen, 16, TARGET, served)
    assert first.samples == 4
    monkeypatch.setattr(generate, "facts_fingerprint", lambda facts: f"v2-{len(facts)}")
    monkeypatch.setattr(generate, "make_engine", lambda *_: served)
    rest = generate_dataset("d", prompts, out, gen, 10**6, TARGET)
    assert rest.new_samples == 4 and rest.samples == 8
    before = part_bytes(out)
    again = generate_dataset("d", prompts, out, gen, 10**6, TARGET)
    assert again.new_turns == 0 and part_bytes(out) == before
    kept = set(read_raw(out).column("fingerprint").to_pylist())
    assert first.fingerprint in kept and len(kept) == 2


def test_the_legacy_formula_hashes_what_it_did():
    """Every value that commit hashed moves it: the model's files, the template, its kwargs,
    the roles, target.dtype as given, each sampling value and the multi-turn mode."""
    sampling = Sampling(max_new_tokens=4, stop_ids=(2,))
    base = generation.legacy_fingerprint(TARGET, sampling, "last_turn")
    others = [
        generation.legacy_fingerprint(TARGET, Sampling(4, seed=1, stop_ids=(2,)), "last_turn"),
        generation.legacy_fingerprint(TARGET, sampling, "all_turns"),
        generation.legacy_fingerprint(
            type(TARGET)(**{**TARGET.__dict__, "dtype": "float32"}), sampling, "last_turn"
        ),
        generation.legacy_fingerprint(
            type(TARGET)(**{**TARGET.__dict__, "roles": {"end_of_turn": "</s>"}}),
            sampling,
            "last_turn",
        ),
    ]
    assert len({base, *others}) == 5
