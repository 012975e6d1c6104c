"""prep@<dataset>: source rows -> chat messages -> the target's chat template -> prompt token ids.

Reads params `target` and `datasets.<name>.prep`. Writes data/prompts/<name>.parquet and
reports/prep/<name>.json (rows read, malformed, duplicate, too long, kept).
"""
from __future__ import annotations

import hashlib
import heapq
import json
from pathlib import Path

import pyarrow as pa

from . import config
from .cli import StageError, run
from .io import write_json, write_parquet
from .sources import SourceError, prompt_messages, read_conversations
from .target import load_tokenizer, render_prompt, token_roles

PROMPTS_SCHEMA = pa.schema([
    ("sample_id", pa.string()), ("dataset", pa.string()), ("messages", pa.string()),
    ("tools", pa.string()), ("prompt_ids", pa.list_(pa.int32())), ("prompt_len", pa.int32()),
    ("reasoning_open", pa.bool_()),
])


def normalized_key(messages: list[dict], tools: list | None) -> str:
    """Prompt identity for dedupe: content with case and whitespace folded."""
    text = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()


def prepare(name: str, prep: config.PrepParams, target: config.TargetParams,
            out: Path, report: Path) -> dict:
    tokenizer = load_tokenizer(target)
    roles = token_roles(target, tokenizer)
    counts = dict(rows=0, malformed=0, duplicate=0, too_long=0, sampled_out=0, kept=0)
    seen: set[str] = set()
    ids_seen: set[str] = set()
    keep: list[tuple[int, str, dict]] = []  # max-heap by -rank: the N lowest seeded ranks
    malformed = []

    def on_bad_row(err: SourceError) -> None:
        counts["malformed"] += 1
        malformed.append(str(err))

    rows = read_conversations(prep.path, prep.format, columns=prep.columns,
                              on_bad_row=on_bad_row if prep.skip_bad_rows else None)
    for conv in rows:
        counts["rows"] += 1
        sample_id = f"{name}/{conv.source_id}"
        try:
            messages = prompt_messages(conv.messages)
        except ValueError as err:
            bad = SourceError(prep.path, None, f"{sample_id}: {err}")
            if not prep.skip_bad_rows:
                raise bad from None
            on_bad_row(bad)
            continue
        key = normalized_key(messages, conv.tools)
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        if sample_id in ids_seen:  # a source id reused for different content: keep both, apart
            sample_id = f"{sample_id}~{key[:8]}"
        ids_seen.add(sample_id)
        ids = render_prompt(tokenizer, messages, conv.tools, target.template_kwargs)
        if len(ids) > prep.max_prompt_tokens:
            counts["too_long"] += 1
            continue
        rank = int(hashlib.sha256(f"{prep.seed}:{sample_id}".encode()).hexdigest()[:15], 16)
        row = dict(sample_id=sample_id, dataset=name,
                   messages=json.dumps(messages, ensure_ascii=False),
                   tools=None if conv.tools is None else json.dumps(conv.tools, ensure_ascii=False),
                   prompt_ids=ids, prompt_len=len(ids),
                   reasoning_open=roles.think is not None and ids[-1] == roles.think)
        heapq.heappush(keep, (-rank, sample_id, row))
        if prep.max_samples is not None and len(keep) > prep.max_samples:
            heapq.heappop(keep)
            counts["sampled_out"] += 1
    if not keep:
        raise StageError(f"{prep.path}: no usable prompt for dataset {name!r} "
                         f"({counts}); check datasets.{name}.prep (format, path, max_prompt_tokens)")
    selected = sorted((row for _, _, row in keep), key=lambda r: r["sample_id"])
    counts["kept"] = len(selected)
    write_parquet(pa.Table.from_pylist(selected, schema=PROMPTS_SCHEMA), out)
    write_json({"dataset": name, **counts, "malformed_examples": malformed[:5]}, report)
    return counts


def main(dataset: str, params: Path = config.PARAMS_FILE,
         out_dir: Path = Path("data/prompts"), report_dir: Path = Path("reports/prep")) -> None:
    """Build the prompt ids of one dataset."""
    ds = config.dataset(dataset, params)
    target = config.section(config.TargetParams, "target", params)
    counts = prepare(dataset, ds.prep, target, out_dir / f"{dataset}.parquet",
                     report_dir / f"{dataset}.json")
    print(f"[prep {dataset}] " + "  ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
    run(main)
