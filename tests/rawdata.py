"""Build raw-generation rows by hand, for merge and quality tests that need no model."""

from __future__ import annotations

import json

import pyarrow as pa

from stages.artifacts.raw import RAW_SCHEMA, append_part


def raw_row(
    dataset: str,
    n: int,
    *,
    prompt: str | None = None,
    prompt_len: int = 5,
    output_len: int = 6,
    reasoning: int | None = 2,
    finish: str = "stop",
    tool_calls: int = 0,
    balanced: bool = True,
    tools: bool = False,
) -> dict:
    text = prompt if prompt is not None else f"{dataset} question {n}"
    return dict(
        sample_id=f"{dataset}/{n}",
        dataset=dataset,
        turn=1,
        messages=json.dumps([{"role": "user", "content": text}]),
        tools=json.dumps([{"type": "function"}]) if tools else None,
        prompt_ids=list(range(100, 100 + prompt_len)),
        prompt_len=prompt_len,
        reasoning_open=True,
        output_ids=list(range(200 + n, 200 + n + output_len)) if finish != "abort" else [],
        finish_reason=finish,
        completion_tokens=output_len if finish != "abort" else 0,
        reasoning_tokens=reasoning,
        answer_tokens=output_len - (reasoning or 0),
        tool_calls=tool_calls,
        tool_calls_balanced=balanced,
        error="boom" if finish == "abort" else None,
        latency_s=0.1,
        engine="test",
        fingerprint="fp",
        output_text="",
    )


def write_raw(directory, rows: list[dict]) -> None:
    append_part(directory, pa.Table.from_pylist(rows, schema=RAW_SCHEMA))
