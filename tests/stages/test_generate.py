import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages import generate
from stages.artifacts.raw import part_facts, parts, read_raw
from stages.engines import EngineError, Sampling
from stages.engines.hf import HFEngine
from stages.generate import generate_dataset
from stages.params.generate import GenerateParams, SGLangParams
from stages.params.server import SGLangLaunchParams
from stages.params.target import TargetParams
from stages.target_model.model import load_causal_lm
from stages.wiring.generation import served_facts
from tests.conftest import STORIES, STORIES_REL

pytestmark = pytest.mark.shared(STORIES_REL)

TARGET = TargetParams(path=str(STORIES), chat_template="tests/fixtures/stories_chat_template.jinja")


@pytest.fixture(scope="module")
def engine():
    return HFEngine(load_causal_lm(str(STORIES)), pad_id=0, batch_size=2)


@pytest.fixture
def prompts(tmp_path):
    rows = [
        dict(
            sample_id=f"d/{i}",
            dataset="d",
            messages=json.dumps([{"role": "user", "content": f"story {i}"}]),
            tools=None,
            prompt_ids=[1, 300 + i, 400 + i],
            prompt_len=3,
            reasoning_open=False,
        )
        for i in range(8)
    ]
    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


class Crashing:
    """An engine that dies after `after` completions, like a killed process."""

    name = "hf"

    def __init__(self, inner, after):
        self.inner, self.after = inner, after

    def generate(self, requests, sampling: Sampling):
        for n, done in enumerate(self.inner.generate(requests, sampling)):
            if n == self.after:
                raise KeyboardInterrupt("killed")
            yield done


def gen_params(**kw):
    return GenerateParams(max_new_tokens=12, append_every=2, batch_size=2, **kw)


def outputs(directory):
    return {r["sample_id"]: r["output_ids"] for r in read_raw(directory).to_pylist()}


@pytest.mark.slow
def test_crash_then_resume_loses_and_duplicates_nothing(tmp_path, prompts, engine):
    ref = generate_dataset("d", prompts, tmp_path / "ref", gen_params(), 10**6, TARGET, engine)
    assert ref.samples == 8 and ref.new_samples == 8
    out = tmp_path / "raw"
    with pytest.raises(KeyboardInterrupt):
        generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, Crashing(engine, 5))
    assert len(read_raw(out)) == 4  # two appends of 2 landed; the fifth was in flight
    resumed = generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    assert resumed.new_samples == 4 and resumed.samples == 8
    assert outputs(out) == outputs(tmp_path / "ref")  # greedy: the same tokens
    table = read_raw(out)
    assert len(set(table.column("sample_id").to_pylist())) == table.num_rows == 8
    assert len(parts(out)) == 1  # compacted


def test_budget_stops_scheduling_and_resumes_when_raised(tmp_path, prompts, engine):
    out = tmp_path / "raw"
    first = generate_dataset("d", prompts, out, gen_params(), 30, TARGET, engine)
    assert first.budget_reached and first.samples == 4  # 2 batches of 2 x 12 tokens
    assert first.budget_overshoot_tokens == 48 - 30
    second = generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    assert second.new_samples == 4 and second.samples == 8


@pytest.mark.slow
def test_changed_sampling_regenerates(tmp_path, prompts, engine):
    out = tmp_path / "raw"
    generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    again = generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    assert again.new_samples == 0
    hot = generate_dataset("d", prompts, out, gen_params(temperature=0.8), 10**6, TARGET, engine)
    assert hot.new_samples == 8
    assert set(read_raw(out).column("fingerprint").to_pylist()) == {hot.fingerprint}


def part_bytes(directory):
    return {f.name: f.read_bytes() for f in sorted(directory.iterdir())}


class Failing:
    """An engine that fails before its first reply: a server down, a wrong URL."""

    name = "hf"

    def generate(self, requests, sampling: Sampling):
        raise EngineError("connection refused")
        yield


@pytest.mark.slow
def test_a_changed_fingerprint_keeps_the_earlier_data_until_the_first_append(
    tmp_path, prompts, engine, capsys
):
    """A sampling change whose run fails before its first append leaves the earlier raw data
    as it was, byte for byte, and says so; one killed after its first append leaves only the
    new turns; the run then completed leaves only the new data."""
    out = tmp_path / "raw"
    earlier = generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    before = part_bytes(out)
    hot = gen_params(temperature=0.8)
    with pytest.raises(EngineError, match="connection refused"):
        generate_dataset("d", prompts, out, hot, 10**6, TARGET, Failing())
    assert part_bytes(out) == before
    assert "is kept as it was" in capsys.readouterr().out
    with pytest.raises(KeyboardInterrupt):
        generate_dataset("d", prompts, out, hot, 10**6, TARGET, Crashing(engine, 3))
    kept = read_raw(out)
    assert kept.num_rows == 2 and earlier.fingerprint not in kept.column("fingerprint").to_pylist()
    done = generate_dataset("d", prompts, out, hot, 10**6, TARGET, engine)
    assert done.samples == 8 and done.new_samples == 6
    assert set(read_raw(out).column("fingerprint").to_pylist()) == {done.fingerprint}


@pytest.mark.slow
def test_a_kill_between_the_first_append_and_the_removal_loses_nothing(
    tmp_path, prompts, engine, monkeypatch
):
    """Killed after the new generation's first part landed but before the earlier parts went:
    the rerun finds the replacement begun, removes the earlier parts and continues."""
    out = tmp_path / "raw"
    generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    hot = gen_params(temperature=0.8)

    def killed(self):
        raise KeyboardInterrupt("killed between the append and the removal")

    with monkeypatch.context() as m:
        m.setattr(generate._Earlier, "begun", killed)
        with pytest.raises(KeyboardInterrupt):
            generate_dataset("d", prompts, out, hot, 10**6, TARGET, engine)
    assert len({fp for f in parts(out) for fp in part_facts(f)}) == 2  # both there
    done = generate_dataset("d", prompts, out, hot, 10**6, TARGET, engine)
    assert done.samples == 8 and done.new_samples == 6
    assert set(read_raw(out).column("fingerprint").to_pylist()) == {done.fingerprint}


class Served:
    """The target behind a server: its replies, and the facts a server's /server_info gives."""

    name = "sglang"

    def __init__(self, inner, dtype: str, model_path: str = "/models/stories", kv: str = "auto"):
        self.inner = inner
        self.reported = dict(served_model=model_path, dtype=dtype, quantization=None)
        self.reported["kv_cache_dtype"] = kv

    def facts(self) -> dict:
        return dict(self.reported)

    def generate(self, requests, sampling: Sampling):
        return self.inner.generate(requests, sampling)


DTYPES_SENT = ("auto", "half", "float", "bfloat16", None)


def bf16(target: TargetParams) -> TargetParams:
    return TargetParams(**{**target.__dict__, "dtype": "bfloat16"})


@pytest.mark.slow
def test_a_dtype_the_server_never_reads_keeps_its_generation(
    tmp_path, prompts, engine, monkeypatch, capsys
):
    """Under a server engine target.dtype shapes no token (the server's own --dtype does):
    editing it keeps data/raw byte for byte and starts no engine; under the hf engine it
    starts over, saying which value changed."""
    served, out = gen_params(engine="sglang"), tmp_path / "raw"
    first = generate_dataset("d", prompts, out, served, 10**6, TARGET, Served(engine, "float32"))
    before = part_bytes(out)
    with monkeypatch.context() as m:
        m.setattr(generate, "make_engine", lambda *_: pytest.fail("an engine was built"))
        again = generate_dataset("d", prompts, out, served, 10**6, bf16(TARGET))
    assert again.new_samples == 0 and again.fingerprint == first.fingerprint
    assert part_bytes(out) == before

    hf_out = tmp_path / "raw-hf"
    generate_dataset("d", prompts, hf_out, gen_params(), 10**6, TARGET, engine)
    capsys.readouterr()
    redone = generate_dataset("d", prompts, hf_out, gen_params(), 10**6, bf16(TARGET), engine)
    assert redone.new_samples == 8
    assert "generated otherwise: dtype 'float32' -> 'bfloat16' (target.dtype under the hf" in (
        capsys.readouterr().out
    )


@pytest.mark.slow
def test_a_server_launched_otherwise_starts_over_once_it_answers(
    tmp_path, prompts, engine, monkeypatch, capsys
):
    """The kept turns match the params, but the server started for the missing ones reports
    another dtype: the run starts over, saying so, the earlier turns kept until its first
    append; a completed run leaves only its own."""
    served, out = gen_params(engine="sglang"), tmp_path / "raw"
    first = generate_dataset("d", prompts, out, served, 30, TARGET, Served(engine, "float32"))
    assert first.samples == 4
    before = part_bytes(out)
    monkeypatch.setattr(generate, "make_engine", lambda *_: Served(Failing(), "bfloat16"))
    with pytest.raises(EngineError, match="connection refused"):
        generate_dataset("d", prompts, out, served, 10**6, TARGET)
    said = capsys.readouterr().out
    assert "generated otherwise: dtype 'float32' -> 'bfloat16' (target.dtype under the hf" in said
    assert "is kept as it was" in said and part_bytes(out) == before
    monkeypatch.setattr(generate, "make_engine", lambda *_: Served(engine, "bfloat16"))
    done = generate_dataset("d", prompts, out, served, 10**6, TARGET)
    assert done.new_samples == done.samples == 8 and done.fingerprint != first.fingerprint
    table = read_raw(out)
    assert set(table.column("fingerprint").to_pylist()) == {done.fingerprint}
    assert {json.loads(g)["dtype"] for g in table.column("generated_by").to_pylist()} == {
        "bfloat16"
    }


def test_a_servers_dtype_is_read_as_sglang_runs_it():
    """--dtype auto by SGLang's rule (the stories target declares float32: served as float16),
    the aliases by their names, a dtype given as it is, none as none."""
    reported = dict(served_model="/m", quantization=None)
    read = {d: served_facts({**reported, "dtype": d}, TARGET)["dtype"] for d in DTYPES_SENT}
    assert read == {
        "auto": "float16",
        "half": "float16",
        "float": "float32",
        "bfloat16": "bfloat16",
        None: None,
    }


def test_a_servers_kv_cache_dtype_is_a_fact_only_where_it_is_not_the_models():
    """The cache in the model's dtype (auto, its alias, a server that does not say) leaves the
    facts, and so the fingerprint of data generated before, as they were; another dtype is a
    fact of its own."""
    reported = dict(served_model="/m", dtype="bfloat16", quantization=None)
    for same in ("auto", "bf16", "bfloat16", None):
        assert served_facts({**reported, "kv_cache_dtype": same}, TARGET) == reported, same
    assert served_facts(reported, TARGET) == reported
    fp8 = served_facts({**reported, "kv_cache_dtype": "fp8_e5m2"}, TARGET)
    assert fp8 == {**reported, "kv_cache_dtype": "fp8_e5m2"}
    said = generate.changes(("f", fp8), reported)
    assert "kv_cache_dtype 'fp8_e5m2' -> None (the server's --kv-cache-dtype" in said
    said = generate.changes(("f", reported), fp8)
    assert "kv_cache_dtype None -> 'fp8_e5m2'" in said


@pytest.mark.slow
def test_a_server_with_another_kv_cache_dtype_starts_over(tmp_path, prompts, engine, capsys):
    """Replies from a server whose KV cache is fp8 are not the bf16 cache's: a rerun against it
    generates again, naming the fact; one whose cache is the model's dtype keeps every turn."""
    served, out = gen_params(engine="sglang"), tmp_path / "raw"
    first = generate_dataset("d", prompts, out, served, 10**6, TARGET, Served(engine, "float32"))
    same = Served(engine, "float32", kv="float32")
    kept = generate_dataset("d", prompts, out, served, 10**6, TARGET, same)
    assert kept.new_samples == 0 and kept.fingerprint == first.fingerprint
    capsys.readouterr()
    fp8 = Served(engine, "float32", kv="fp8_e5m2")
    redone = generate_dataset("d", prompts, out, served, 10**6, TARGET, fp8)
    assert redone.new_samples == 8 and redone.fingerprint != first.fingerprint
    assert "kv_cache_dtype None -> 'fp8_e5m2'" in capsys.readouterr().out


def test_rows_carry_the_contract(tmp_path, prompts, engine):
    out = tmp_path / "raw"
    generate_dataset("d", prompts, out, gen_params(), 10**6, TARGET, engine)
    row = read_raw(out).to_pylist()[0]
    assert row["completion_tokens"] == len(row["output_ids"]) == 12
    assert row["finish_reason"] == "length" and row["engine"] == "hf"
    assert row["reasoning_tokens"] is None and row["answer_tokens"] == 12
    assert row["prompt_ids"] == [1, 300, 400]


@pytest.mark.parametrize("budget", [10**6, 30])
def test_nothing_left_to_generate_starts_no_engine(tmp_path, prompts, engine, monkeypatch, budget):
    """A rerun with every sample done, or the budget spent, builds no engine: with `launch` set
    that would start a server (tens of minutes for a large target) to find nothing to do."""
    out = tmp_path / "raw"
    sglang = gen_params(
        engine="sglang",
        sglang=SGLangParams(launch=SGLangLaunchParams(module="sglang.launch_server")),
    )
    generate_dataset("d", prompts, out, sglang, budget, TARGET, engine)  # its ids, as served

    def no_engine(*_):
        raise AssertionError("an engine was built with nothing left to generate")

    monkeypatch.setattr(generate, "make_engine", no_engine)
    again = generate_dataset("d", prompts, out, sglang, budget, TARGET)
    assert again.new_samples == 0 and again.engine == "sglang"
    if budget == 30:  # samples are left: a raised budget does build one (the patch is live)
        with pytest.raises(AssertionError, match="an engine was built"):
            generate_dataset("d", prompts, out, sglang, 10**6, TARGET)
