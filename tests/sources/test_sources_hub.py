"""stages.sources.hub: a hub dataset saved as Parquet that the adapters read. The `datasets`
library is replaced by a stand-in with its interface (the tests run offline)."""

from __future__ import annotations

import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.sources import read_conversations
from stages.sources.hub import download, main


class FakeSplit:
    """What `datasets.load_dataset(..., split=...)` returns, as far as download uses it."""

    def __init__(self, rows: list[dict]):
        self.table = pa.Table.from_pylist(rows)
        self.num_rows = self.table.num_rows

    def to_parquet(self, path: str) -> None:
        pq.write_table(self.table, path)


@pytest.fixture
def hub(monkeypatch) -> list[tuple]:
    calls = []

    def load_dataset(dataset_id, config=None, split=None, revision=None):
        calls.append((dataset_id, config, split, revision))
        return FakeSplit(
            [
                {"question": "What is 2 + 3?", "answer": "5"},
                {"question": "What is 7 * 6?", "answer": "42"},
            ]
        )

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_download_writes_parquet_an_adapter_reads(hub, tmp_path):
    out = tmp_path / "sources" / "gsm8k.parquet"
    assert download("openai/gsm8k", out, split="test", config="main", revision="abc123") == 2
    assert hub == [("openai/gsm8k", "main", "test", "abc123")]
    prompts = [c.messages[0]["content"] for c in read_conversations(out, "gsm8k")]
    assert prompts == ["What is 2 + 3?", "What is 7 * 6?"]
    assert [p.name for p in out.parent.iterdir()] == ["gsm8k.parquet"]  # no temp file left


def test_without_the_datasets_library_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails
    with pytest.raises(SystemExit, match=r"pip install -e \.\[hub\]"):
        download("openai/gsm8k", tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_the_output_must_be_parquet(hub, tmp_path):
    with pytest.raises(SystemExit, match="x.jsonl: .* name it \\*.parquet"):
        main("openai/gsm8k", tmp_path / "x.jsonl")
    assert hub == []
