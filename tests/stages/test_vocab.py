import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.cli import StageError
from stages.vocab import supervised_counts


def test_counts_only_supervised_tokens(tmp_path):
    rows = [
        dict(input_ids=[1, 2, 3, 7, 7, 8, 4, 5, 6], loss_spans=[[3, 5], [6, 8]]),
        dict(input_ids=[7, 2, 9], loss_spans=[[1, 3]]),
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    counts = supervised_counts(path, vocab_size=10)
    assert counts.tolist() == [0, 0, 1, 0, 1, 1, 0, 2, 0, 1]


def test_token_outside_the_vocabulary_names_the_file(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([dict(input_ids=[1, 50], loss_spans=[[1, 2]])]), path)
    with pytest.raises(StageError, match=r"train.parquet: token id 50 is outside"):
        supervised_counts(path, vocab_size=10)
