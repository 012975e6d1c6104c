import gzip
import json
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.sources import rows
from stages.sources.rows import RowError, SourceError, read_rows, require

RECORDS = [{"id": i, "text": f"row {i} " + "x" * (i * 7)} for i in range(50)]


def numbered(path, **kwargs):
    return [(row.number, row.unit, row.record) for row in read_rows(path, **kwargs)]


@pytest.mark.parametrize("chunk_chars", [1, 13, 1 << 20])
def test_json_list_streams_elements_across_chunk_boundaries(tmp_path, monkeypatch, chunk_chars):
    monkeypatch.setattr(rows, "_CHUNK_CHARS", chunk_chars)
    path = tmp_path / "data.json"
    path.write_text(json.dumps(RECORDS, indent=2))
    assert numbered(path) == [(i + 1, "row", r) for i, r in enumerate(RECORDS)]


def test_json_list_of_numbers_is_not_cut_at_a_chunk_edge(tmp_path, monkeypatch):
    monkeypatch.setattr(rows, "_CHUNK_CHARS", 3)
    path = tmp_path / "data.json"
    path.write_text("[12345, 678]")
    errors = []
    assert list(read_rows(path, on_bad_row=errors.append)) == []
    assert [e.row for e in errors] == [1, 2]
    assert "is a number, expected an object" in errors[0].reason


@pytest.mark.parametrize(
    "text, row, fragment",
    [
        ('[{"a": 1}, {"a": 2,}]', 2, "not valid JSON"),
        ('[{"a": 1} {"a": 2}]', 2, "expected ',' or ']' after element 1"),
        ('[{"a": 1}] trailing', 2, "after the closing ']'"),
        ('[{"a": 1}', 2, "found 'the end of the file'"),
    ],
)
def test_json_list_syntax_error_names_the_element_and_is_fatal(tmp_path, text, row, fragment):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(SourceError) as caught:
        list(read_rows(path, on_bad_row=lambda err: None))
    assert caught.value.row == row and fragment in caught.value.reason
    assert str(caught.value).startswith(f"{path}, row {row}: ")


def test_jsonl_counts_lines_and_skips_bad_ones_when_asked(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"a": 1}\n\n  \n{"a": 2\n[1, 2]\n\xff\xfe\n{"a": 3}\n')
    errors = []
    assert numbered(path, on_bad_row=errors.append) == [
        (1, "line", {"a": 1}),
        (7, "line", {"a": 3}),
    ]
    assert [(e.row, e.unit) for e in errors] == [(4, "line"), (5, "line"), (6, "line")]
    assert "not valid JSON" in errors[0].reason and "expected an object" in errors[1].reason
    assert str(errors[0]).startswith(f"{path}, line 4: ")
    with pytest.raises(SourceError, match="line 4"):
        list(read_rows(path))


def test_gzipped_jsonl_and_json_and_bom(tmp_path):
    jsonl = tmp_path / "data.jsonl.gz"
    with gzip.open(jsonl, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in RECORDS[:3])
    listed = tmp_path / "data.json.gz"
    with gzip.open(listed, "wt", encoding="utf-8-sig") as f:
        json.dump(RECORDS[:3], f)
    assert [r.record for r in read_rows(jsonl)] == RECORDS[:3]
    assert [r.record for r in read_rows(listed)] == RECORDS[:3]


def test_json_file_holding_json_lines_is_read_by_line(tmp_path):
    path = tmp_path / "hub_export.json"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS[:3]))
    assert numbered(path) == [(i + 1, "line", r) for i, r in enumerate(RECORDS[:3])]


def test_parquet_rows_are_numbered_across_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(rows, "_PARQUET_BATCH_ROWS", 7)
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(RECORDS), path, row_group_size=20)
    assert numbered(path) == [(i + 1, "row", r) for i, r in enumerate(RECORDS)]


def test_file_errors_are_raised_before_iteration(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        read_rows(tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(SourceError, match=r"unknown file type; use one of \.json, \.jsonl"):
        read_rows(tmp_path / "data.csv")
    (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(SourceError, match="not a readable Parquet file"):
        list(read_rows(tmp_path / "fake.parquet"))


def test_source_error_survives_pickling():
    error = SourceError("a.jsonl", 3, "missing field 'x'", "line")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.path, copy.row, copy.reason, copy.unit) == (
        "a.jsonl",
        3,
        "missing field 'x'",
        "line",
    )
    assert str(copy) == "a.jsonl, line 3: missing field 'x'"
    assert str(SourceError("a.json", None, "no such file")) == "a.json: no such file"


def test_require_names_the_field_and_what_exists():
    record = {"question": "q", "n": True, "none": None}
    assert require(record, "question", str) == "q"
    with pytest.raises(RowError, match=r"missing field 'prompt' \(fields present: question, n, "):
        require(record, "prompt", str)
    with pytest.raises(RowError, match="turns\\[2\\]: field 'n' is a boolean, expected a number"):
        require(record, "n", int, "turns[2]")
    with pytest.raises(RowError, match="field 'none' is null, expected a string or a list"):
        require(record, "none", (str, list))


def test_truncated_gzip_is_reported_at_the_line_it_breaks(tmp_path):
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in RECORDS).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    seen = []
    with pytest.raises(SourceError, match="cannot read the file") as caught:
        seen.extend(read_rows(path))
    assert 0 < len(seen) < len(RECORDS) and caught.value.row == len(seen) + 1
    (tmp_path / "fake.json.gz").write_text("[not gzip]")
    with pytest.raises(SourceError, match="cannot read the file"):
        read_rows(tmp_path / "fake.json.gz")
