"""The raw-generation artifact: a directory of Parquet parts, appended atomically.

One row per generated turn: `turn` 1 is a sample's first reply (its only one in last_turn mode);
with `regenerate: all_turns` turn k+1's prompt holds turn k's prompt and output
(engines/turns.py), with `all_turns_rendered` it is the chat template's rendering of the
conversation so far (target/history.py). `regenerate` records which, per row, for the merge. A
generation run appends a part every few replies, so a kill loses at most the requests in flight;
the rerun reads the parts, skips what is done and compacts them into one part when it completes.
Each part has its size and sha256 beside it (`part-NNNNN.parquet.sha256.json`): a part truncated or
corrupted after it was written (a machine crash) is found before it is read (`verified_parts`),
and a generation rerun drops it and generates its turns again (`drop_corrupt_parts`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..runtime.files import checksum_problem, remove_with_checksum, verify_checksum, write_parquet

RAW_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("dataset", pa.string()),
        ("turn", pa.int32()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("prompt_len", pa.int32()),
        ("reasoning_open", pa.bool_()),
        ("output_ids", pa.list_(pa.int32())),
        ("finish_reason", pa.string()),
        ("completion_tokens", pa.int32()),
        ("reasoning_tokens", pa.int32()),
        ("answer_tokens", pa.int32()),
        ("tool_calls", pa.int32()),
        ("tool_calls_balanced", pa.bool_()),
        ("error", pa.string()),
        ("latency_s", pa.float32()),
        ("engine", pa.string()),
        ("fingerprint", pa.string()),
        # the values the fingerprint hashes, as JSON (generated_by): which one changed is named
        # when a rerun starts over (null in raw data written before the column existed)
        ("generated_by", pa.string()),
        ("output_text", pa.string()),
        # the prompts file's mode: last_turn | all_turns | all_turns_rendered (null in raw data
        # written before the column existed, which knew no rendered turns)
        ("regenerate", pa.string()),
    ]
)

_PART = re.compile(r"part-(\d{5})\.parquet$")


def parts(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).glob("part-*.parquet") if _PART.search(p.name))


def facts_fingerprint(facts: dict) -> str:
    """The generation fingerprint: a hash of every value that shapes the generated tokens."""
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def part_facts(path: Path) -> dict[str, dict | None]:
    """Per fingerprint among one part's rows, the values it hashes (None where the rows predate
    the generated_by column)."""
    names = set(pq.read_schema(path).names)
    columns = ["fingerprint", "generated_by"] if "generated_by" in names else ["fingerprint"]
    return generations(pq.read_table(path, columns=columns))


def generations(table: pa.Table) -> dict[str, dict | None]:
    """Per fingerprint among `table`'s rows, in the order they come, the facts its first row
    recorded (None where the rows predate the generated_by column)."""
    names = table.column_names
    recorded = table.column("generated_by").to_pylist() if "generated_by" in names else None
    first: dict[str, str | None] = {}
    for i, fp in enumerate(table.column("fingerprint").to_pylist()):
        first.setdefault(fp, recorded[i] if recorded else None)
    return {fp: json.loads(text) if text else None for fp, text in first.items()}


def verified_parts(directory: Path) -> list[Path]:
    """The parts, each checked against its recorded size and sha256; ChecksumError names the
    first one that is not what was written."""
    files = parts(directory)
    for f in files:
        verify_checksum(f)
    return files


def drop_corrupt_parts(directory: Path) -> list[tuple[Path, str]]:
    """Remove the parts that are not what was written (truncated, bit-flipped, no checksum), so
    their turns count as not generated; (part, why) for each."""
    dropped = []
    for f in parts(directory):
        problem = checksum_problem(f)
        if problem:
            remove_with_checksum(f)
            dropped.append((f, problem))
    return dropped


def read_raw(directory: Path) -> pa.Table:
    """All rows of the parts, the first copy of each sample's turn kept."""
    files = parts(directory)
    if not files:
        return RAW_SCHEMA.empty_table()
    table = pa.concat_tables(pq.read_table(f, schema=RAW_SCHEMA) for f in files)
    keys = zip(table.column("sample_id").to_pylist(), table.column("turn").to_pylist())
    first: dict[tuple[str, int], int] = {}  # (sample id, turn) -> its first row
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    if len(first) == table.num_rows:
        return table
    return table.take(sorted(first.values()))


def _part_number(path: Path) -> int:
    match = _PART.search(path.name)
    if match is None:  # parts() lists only names that match
        raise ValueError(f"{path}: not a raw part (part-NNNNN.parquet)")
    return int(match.group(1))


def append_part(directory: Path, table: pa.Table) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    existing = parts(directory)
    index = _part_number(existing[-1]) + 1 if existing else 0
    path = directory / f"part-{index:05d}.parquet"
    write_parquet(table.cast(RAW_SCHEMA), path, checksum=True)
    return path


def compact(directory: Path, table: pa.Table) -> None:
    """Replace all parts by one holding `table`: the new part lands before the old ones go, so a
    kill in between leaves duplicates that read_raw drops, never a loss. A folder that already
    is that one part is left as it is (a rerun with nothing to generate changes nothing)."""
    old = parts(directory)
    same_count = len(old) == 1 and pq.ParquetFile(old[0]).metadata.num_rows == table.num_rows
    if same_count and read_raw(directory).equals(table):
        return  # already one part of these rows: a new name would change the output's hash
    new = append_part(directory, table)
    for p in old:
        if p != new:
            remove_with_checksum(p)


def last_turns(
    table: pa.Table, with_ids: bool, with_outputs: bool = False
) -> dict[str, tuple[int, dict]]:
    """Per sample id: how many turns are stored (turns are stored in order, each requested only
    after the one before it came back), and the last of them, with its prompt and output ids
    when a later turn may be built from them (`with_ids`), and with `outputs`, every stored
    turn's (output ids, reasoning_open) in turn order, when a later turn is rendered from the
    conversation so far (`with_outputs`)."""
    turns = table.column("turn").to_pylist()
    last: dict[str, int] = {}
    for i, sample_id in enumerate(table.column("sample_id").to_pylist()):
        if sample_id not in last or turns[i] > turns[last[sample_id]]:
            last[sample_id] = i
    columns = ["sample_id", "turn", "finish_reason"] + (
        ["prompt_ids", "output_ids"] if with_ids else []
    )
    rows = table.select(columns).take(pa.array(list(last.values()), pa.int64())).to_pylist()
    found = {r["sample_id"]: (r["turn"], r) for r in rows}
    if with_outputs:
        for _, row in found.values():
            row["outputs"] = []
        ordered = table.select(["sample_id", "turn", "output_ids", "reasoning_open"]).sort_by(
            [("sample_id", "ascending"), ("turn", "ascending")]
        )
        for r in ordered.to_pylist():
            found[r["sample_id"]][1]["outputs"].append((r["output_ids"], r["reasoning_open"]))
    return found
