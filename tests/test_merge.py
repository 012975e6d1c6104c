import pyarrow.parquet as pq
import pytest

from stages.cli import StageError
from stages.config import MergeParams
from stages.merge import merge
from tests.rawdata import raw_row, write_raw


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
    assert metrics["summary"]["train"]["samples"] == train.num_rows
    assert sum(d["duplicates"] for s in metrics["per_dataset"].values() for d in s.values()) == 1


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
