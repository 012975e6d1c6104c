import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.cli import StageError
from stages.vocab import supervised_counts


def test_counts_only_supervised_tokens(tmp_path):
    rows = [dict(input_ids=[1, 2, 3, 7, 7, 8], loss_start=3),
            dict(input_ids=[7, 2, 9], loss_start=1)]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    counts = supervised_counts(path, vocab_size=10)
    assert counts.tolist() == [0, 0, 1, 0, 0, 0, 0, 2, 1, 1]


def test_token_outside_the_vocabulary_names_the_file(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([dict(input_ids=[1, 50], loss_start=1)]), path)
    with pytest.raises(StageError, match=r"train.parquet: token id 50 is outside"):
        supervised_counts(path, vocab_size=10)
