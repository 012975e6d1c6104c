"""Write the demo prompt files: held-out demo conversations in the real public dataset formats.

    python -m demo.write_prompts --out data/demo/prompts [--per-source N --seed S]

Each file holds the reference replies too, as the real datasets do; the pipeline keeps only the
prompts and regenerates the replies with the target.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
from pathlib import Path

from demo.corpus import (
    CODE_TASKS,
    DEMO_SEED,
    GLAIVE_SYSTEM,
    Conversation,
    demo_conversations,
    example_value,
)

GLAIVE_TURN_END = " <|endoftext|>"
GLAIVE_TURN_SEPARATOR = "\n\n\n"


def glaive_row(conversation: Conversation) -> dict:
    """Glaive function-calling v2 raw: `system` with pretty-printed function definitions, `chat`
    with USER / ASSISTANT / FUNCTION RESPONSE turns and single-quoted call arguments."""
    if conversation.tools is None:
        raise ValueError(f"a {conversation.kind} conversation has no tools to define")
    definitions = "\n\n".join(json.dumps(t["function"], indent=4) for t in conversation.tools)
    turns = []
    for message in conversation.messages:
        if message["role"] == "user":
            turns.append(f"USER: {message['content']}")
        elif message["role"] == "tool":
            turns.append(f"FUNCTION RESPONSE: {message['content']}")
        elif message["role"] == "assistant" and message.get("tool_calls"):
            function = message["tool_calls"][0]["function"]
            turns.append(
                f'ASSISTANT: <functioncall> {{"name": "{function["name"]}", '
                f"\"arguments\": '{function['arguments']}'}}{GLAIVE_TURN_END}"
            )
        elif message["role"] == "assistant":
            turns.append(f"ASSISTANT: {message['content']}{GLAIVE_TURN_END}")
    return {
        "system": f"SYSTEM: {GLAIVE_SYSTEM} -\n{definitions}\n",
        "chat": GLAIVE_TURN_SEPARATOR.join(turns) + GLAIVE_TURN_SEPARATOR,
    }


def _task_of(conversation: Conversation):
    """The code task and function name a code conversation asks for."""
    for task in CODE_TASKS:
        for name in task.names:
            if f"`{name}`" in conversation.request:
                return task, name
    raise ValueError(f"no code task matches the request {conversation.request[:80]!r}")


def _row_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def opencodeinstruct_row(conversation: Conversation, rng: random.Random) -> dict:
    """OpenCodeInstruct: every column is a string, test data included."""
    task, name = _task_of(conversation)
    call = task.example.replace("{name}", name)
    judgement = {
        "requirement_conformance": {
            "score": 5,
            "justification": "The function meets every stated requirement.",
        },
        "logical_correctness": {
            "score": 5,
            "justification": "The logic is correct and handles the example.",
        },
        "edge_case_consideration": {
            "score": rng.choice((4, 5)),
            "justification": "Common edge cases are handled.",
        },
    }
    return {
        "id": _row_hash(conversation.request)[:32],
        "input": conversation.request,
        "output": conversation.reply["content"],
        "domain": rng.choice(("generic", "algorithmic")),
        "generation_algorithm": rng.choice(("self-instruct", "evol-instruct")),
        "llm_judgement": json.dumps(judgement),
        "unit_tests": json.dumps([f"assert {call} == {example_value(task, name)!r}"]),
        "tests_execution_status": json.dumps(["pass"]),
        "average_test_score": "1",
    }


def magicoder_row(conversation: Conversation, index: int, rng: random.Random) -> dict:
    """Magicoder OSS-Instruct: the problem, its solution and the code snippet that seeded it."""
    task, name = _task_of(conversation)
    return {
        "lang": "python",
        "raw_index": rng.randrange(1_000_000),
        "index": index,
        "seed": "\n".join(task.body.replace("{name}", name).splitlines()[:3]),
        "openai_fingerprint": "fp_" + _row_hash(str(index))[:10],
        "problem": conversation.request,
        "solution": conversation.reply["content"],
    }


def sharegpt_row(conversation: Conversation, rng: random.Random) -> dict:
    """ShareGPT: an id and the turns as human / gpt (system when present)."""
    speakers = {"system": "system", "user": "human", "assistant": "gpt"}
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return {
        "id": "".join(rng.choice(alphabet) for _ in range(7)) + "_0",
        "conversations": [
            {"from": speakers[m["role"]], "value": m["content"]} for m in conversation.messages
        ],
    }


def _write_atomically(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, path)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def write_prompts(out: Path, per_source: int = 40, seed: int = DEMO_SEED) -> dict[str, Path]:
    """Write the four demo prompt files under `out`; returns their paths by source."""
    demo = demo_conversations(per_source, seed)
    rng = random.Random(seed)
    contents = {
        "glaive_fc.jsonl": _jsonl([glaive_row(c) for c in demo["glaive_fc"]]),
        "opencodeinstruct.jsonl": _jsonl(
            [opencodeinstruct_row(c, rng) for c in demo["opencodeinstruct"]]
        ),
        "magicoder.jsonl": _jsonl(
            [magicoder_row(c, i, rng) for i, c in enumerate(demo["magicoder"])]
        ),
        "sharegpt.json": json.dumps(
            [sharegpt_row(c, rng) for c in demo["sharegpt"]], indent=2, ensure_ascii=False
        )
        + "\n",
    }
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, text in contents.items():
        _write_atomically(out / name, text)
        paths[name.split(".")[0]] = out / name
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the prompt files")
    parser.add_argument("--per-source", type=int, default=40, help="prompts per file")
    parser.add_argument("--seed", type=int, default=DEMO_SEED)
    args = parser.parse_args(argv)
    for source, path in write_prompts(args.out, args.per_source, args.seed).items():
        print(f"{source}: {path}")


if __name__ == "__main__":
    main()
