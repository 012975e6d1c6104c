"""Build raw-generation rows by hand, for merge and quality tests that need no model."""

from __future__ import annotations

import json
import random
from pathlib import Path

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


def mixed_raw(root: Path) -> list[Path]:
    """Raw data of every kind the merge meets, seeded: `solo` (last_turn; failed, empty and
    over-long replies, prompts repeated from `chat`, two parts with one row in both, as an
    interrupted compaction leaves them), `chat` (all_turns, 1 to 4 turns, each later prompt the
    turn before's prompt and output and two template ids; a failed turn ends a conversation) and
    `rendered` (all_turns_rendered, 1 to 3 turns); lengths around a max_length of 48. Returns the
    datasets' directories."""
    rng = random.Random(7)

    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(1000) for _ in range(rng.randint(low, high))]

    def turn(dataset: str, n: int, k: int, prompt_ids: list[int], output: list[int], **kw) -> dict:
        row = raw_row(dataset, n, **kw)
        return dict(
            row,
            turn=k,
            prompt_ids=prompt_ids,
            prompt_len=len(prompt_ids),
            output_ids=output if row["finish_reason"] != "abort" else [],
            completion_tokens=len(output) if row["finish_reason"] != "abort" else 0,
            regenerate={"solo": "last_turn", "chat": "all_turns"}.get(
                dataset, "all_turns_rendered"
            ),
        )

    solo = [
        turn(
            "solo",
            n,
            1,
            ids(2, 60 if n % 9 == 0 else 20),
            ids(0 if n % 11 == 0 else 1, 40),
            prompt=f"chat question {n}" if n % 7 == 0 else None,
            finish="abort" if n % 13 == 0 else "stop",
        )
        for n in range(80)
    ]
    chat = []
    for n in range(40):
        prompt = ids(2, 12)
        for k in range(1, rng.randint(1, 4) + 1):
            output = ids(1, 16)
            chat.append(
                turn("chat", n, k, prompt, output, finish="abort" if (n, k) == (5, 2) else "stop")
            )
            prompt = prompt + output + ids(2, 2)
    rendered = [
        turn("rendered", n, k, ids(2, 40), ids(1, 20))
        for n in range(25)
        for k in range(1, rng.randint(1, 3) + 1)
    ]
    write_raw(root / "solo", solo[:50])
    write_raw(root / "solo", solo[49:])
    write_raw(root / "chat", chat)
    write_raw(root / "rendered", rendered)
    return [root / "solo", root / "chat", root / "rendered"]
