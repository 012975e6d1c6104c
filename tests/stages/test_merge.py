import hashlib
import json

import duckdb
import pyarrow.parquet as pq
import pytest

from stages import merge as merge_stage
from stages.artifacts.merged import SPLITS
from stages.cli import StageError
from stages.merge import merge
from stages.params.merge import MergeParams
from stages.runtime.errors import ParamsError
from tests.rawdata import mixed_raw, raw_row, write_raw

# What the merge wrote over mixed_raw before it ran in bounded memory (one DuckDB query holding
# every sequence's ids, then sorted): the sha256 of both splits' rows and column types and of
# its report (`merged_digest`), per params. The bounded merge must write the same.
DIGESTS_BEFORE_BOUNDED_MEMORY = {
    (3, 0.3, 48): "1b2414e9482e8c875ce6ad96c6403af8ddae5f2551ddec7e48fa168510cbe7e5",
    (0, 0.0, 4096): "f57dc5a6e4290d8ed874a3bdded561bee94bbf185de8ddbf5597960b9ce67376",
}


@pytest.fixture
def raw_dirs(tmp_path):
    a = [raw_row("a", i) for i in range(40)]
    a.append(raw_row("a", 99, finish="abort"))  # failed: never merged
    b = [raw_row("b", i, output_len=10) for i in range(30)]
    b.append(raw_row("b", 98, prompt="A  question 3"))  # same normalised prompt as a/3
    write_raw(tmp_path / "raw" / "a", a[:20])
    write_raw(tmp_path / "raw" / "a", a[20:])  # two parts, as an interrupted run leaves them
    write_raw(tmp_path / "raw" / "b", b)
    return [tmp_path / "raw" / "a", tmp_path / "raw" / "b"]


def test_merge_joins_dedupes_splits(tmp_path, raw_dirs):
    out = tmp_path / "merged"
    metrics = merge(raw_dirs, out, MergeParams(seed=1, eval_fraction=0.25, max_length=64))
    train, ev = pq.read_table(out / "train.parquet"), pq.read_table(out / "eval.parquet")
    ids = train.column("sample_id").to_pylist() + ev.column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) == 70  # 40 + 31, minus the failed one, minus one duplicate
    assert "a/99" not in ids and ("a/3" in ids) != ("b/98" in ids)
    assert 5 <= ev.num_rows <= 30
    row = train.slice(0, 1).to_pylist()[0]
    assert row["input_ids"][: row["loss_spans"][0][0]] == list(range(100, 105))
    assert row["loss_spans"] == [[5, row["length"]]]
    assert len(row["input_ids"]) == row["length"] == 5 + (6 if row["dataset"] == "a" else 10)
    assert metrics.summary.train.samples == train.num_rows
    per = [*metrics.per_dataset.train.values(), *metrics.per_dataset.eval.values()]
    assert sum(d.duplicates for d in per) == 1


def test_merge_is_deterministic_and_seeded(tmp_path, raw_dirs):
    orders = []
    for seed in (1, 1, 2):
        merge(raw_dirs, tmp_path / f"m{seed}", MergeParams(seed=seed, eval_fraction=0.25))
        orders.append(
            pq.read_table(tmp_path / f"m{seed}" / "train.parquet").column("sample_id").to_pylist()
        )
    assert orders[0] == orders[1] and orders[0] != orders[2]
    assert orders[0] != sorted(orders[0])  # shuffled


def test_merge_truncates_to_max_length(tmp_path, raw_dirs):
    merge(raw_dirs, tmp_path / "m", MergeParams(eval_fraction=0.0, max_length=8))
    t = pq.read_table(tmp_path / "m" / "train.parquet").to_pylist()
    assert all(len(r["input_ids"]) == 8 and r["truncated"] for r in t)


def test_merge_without_data_fails_clearly(tmp_path):
    with pytest.raises(StageError, match="no raw generations"):
        merge([tmp_path / "nothing"], tmp_path / "m", MergeParams())


def merged_digest(out, report: dict) -> str:
    content: dict = {"report": report}
    for split in SPLITS:
        table = pq.read_table(out / f"{split}.parquet")
        columns = [(f.name, str(f.type)) for f in table.schema]
        content[split] = {"columns": columns, "rows": table.to_pylist()}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("key", sorted(DIGESTS_BEFORE_BOUNDED_MEMORY))
def test_bounded_merge_writes_what_the_whole_data_merge_wrote(tmp_path, key):
    """Every kind of raw data (failed and empty replies, duplicates across datasets, a row in two
    parts, all_turns conversations shortened or cut at max_length, rendered turns): the same
    rows, order, split, ids and report as before, whatever the memory limit and threads."""
    seed, eval_fraction, max_length = key
    dirs = mixed_raw(tmp_path / "raw")
    for limit, threads in ((4.0, None), (2.0, 1)):
        out = tmp_path / f"m{limit}"
        params = MergeParams(seed, eval_fraction, max_length, limit, threads)
        report = merge(dirs, out, params)
        assert merged_digest(out, report.to_json()) == DIGESTS_BEFORE_BOUNDED_MEMORY[key]
        assert sorted(p.name for p in out.iterdir()) == ["eval.parquet", "train.parquet"]


def test_a_row_whose_lengths_are_not_its_ids_fails_naming_it(tmp_path):
    rows = [raw_row("a", i) for i in range(5)]
    rows[3]["prompt_len"] += 1  # the spans would be off by one
    write_raw(tmp_path / "raw" / "a", rows)
    with pytest.raises(StageError) as err:
        merge([tmp_path / "raw" / "a"], tmp_path / "m", MergeParams(eval_fraction=0.0))
    message = str(err.value)
    assert "raw row a/3 (row 3 of " in message and "part-00000.parquet" in message
    assert "not the lengths of its prompt_ids and output_ids" in message
    assert "data/raw/<dataset> and generate it again" in message
    assert not list((tmp_path / "m").glob("*.parquet")) and not list((tmp_path / "m").glob(".*"))


@pytest.mark.parametrize(
    "values, needle",
    [
        (dict(memory_limit_gb=1.0), r"merge.memory_limit_gb: 1.0 is out of range; allowed: >= 2"),
        (dict(threads=0), r"merge.threads: 0 is out of range; allowed: >= 1"),
    ],
)
def test_memory_settings_out_of_range_name_the_key(values, needle):
    with pytest.raises(ParamsError, match=needle):
        MergeParams(**values)


def test_running_out_of_memory_names_the_param_to_raise(tmp_path, raw_dirs, monkeypatch):
    def out_of_memory(*args):
        raise duckdb.OutOfMemoryException(
            "Out of Memory Error: failed to allocate data of size 16.0 MiB (1.8 GiB/1.8 GiB used)"
            "\n\nPossible solutions:\n* Reducing the number of threads"
        )

    monkeypatch.setattr(merge_stage, "run_queries", out_of_memory)
    with pytest.raises(StageError) as err:
        merge(raw_dirs, tmp_path / "m", MergeParams(memory_limit_gb=2))
    assert str(err.value) == (
        "merge: Out of Memory Error: failed to allocate data of size 16.0 MiB (1.8 GiB/1.8 GiB "
        "used) (merge.memory_limit_gb: 2); raise merge.memory_limit_gb in params.yaml"
    )
    assert not list((tmp_path / "m").glob(".spill*"))
