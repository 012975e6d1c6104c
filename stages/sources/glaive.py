"""Glaive function-calling v2 as published: two strings per row, `system` and `chat`.

    system: "SYSTEM: You are a helpful assistant with access to the following functions. Use them
             if required -\n{function JSON}\n\n{function JSON}\n"
    chat:   "USER: ...\n\n\nASSISTANT: <functioncall> {"name": "f", "arguments": '{"a": 1}'}
             <|endoftext|>\n\n\nFUNCTION RESPONSE: {...}\n\n\nASSISTANT: ... <|endoftext|>"

The system text before the first '{' (less the trailing " -") is the system message; the JSON
objects after it, none or several, are the tools. `<functioncall>` turns become assistant tool
calls and FUNCTION RESPONSE turns tool results. Quirks of the real data handled here: `arguments`
is usually a JSON object wrapped in single quotes (so the call is not JSON), with apostrophes and
raw newlines inside; `<|endoftext|>` ends assistant turns and is dropped; turns are separated by
any whitespace, not only blank lines.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from .conversation import Conversation, Turns, row_id, tool_call
from .rows import RowError, require

END_OF_TURN = "<|endoftext|>"
CALL_TAG = "<functioncall>"
SPEAKER = re.compile(r"(?:^|(?<=\s))(USER|ASSISTANT|FUNCTION RESPONSE):")
# {"name": "f", "arguments": '<JSON>'}: the quoted JSON runs to the last quote before the brace.
QUOTED_ARGUMENTS = re.compile(
    r"""\{\s* "name" \s*:\s* (?P<name> "(?:[^"\\]|\\.)*" ) \s*,\s*
                                  "arguments" \s*:\s* '(?P<arguments>.*)' \s*\}""",
    re.DOTALL | re.VERBOSE,
)


def parse_row(record: Mapping) -> Conversation:
    instructions, tools = split_system(require(record, "system", str))
    turns = Turns()
    turns.system(instructions)
    for i, (speaker, text) in enumerate(split_chat(require(record, "chat", str))):
        where = f"chat turn {i + 1} ({speaker})"
        if speaker == "USER":
            turns.user(text)
        elif speaker == "FUNCTION RESPONSE":
            turns.tool(text, where=where)
        else:
            prose, *calls = text.split(CALL_TAG)
            turns.assistant(prose.strip(), [parse_call(call, where) for call in calls])
    return Conversation(row_id(record), turns.build(), tools)


def split_system(system: str) -> tuple[str, list[dict] | None]:
    """(the system message, the tools it defines or None)."""
    text = system.strip().removeprefix("SYSTEM:").strip()
    start = text.find("{")
    if start < 0:
        return text, None
    instructions = text[:start].rstrip().removesuffix("-").rstrip()
    return instructions, [
        {"type": "function", "function": spec} for spec in _json_objects(text[start:], "system")
    ]


def _json_objects(text: str, where: str) -> list[dict]:
    """The JSON objects in `text`, separated by whitespace or commas."""
    decoder, pos = json.JSONDecoder(), 0
    objects: list[dict] = []
    while (pos := _skip_separators(text, pos)) < len(text):
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise RowError(
                f"{where}: function definition {len(objects) + 1} is not valid JSON ({err})"
            ) from None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            raise RowError(
                f"{where}: function definition {len(objects) + 1} is not an object with a name"
            )
        objects.append(value)
    return objects


def _skip_separators(text: str, pos: int) -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] == ","):
        pos += 1
    return pos


def split_chat(chat: str) -> list[tuple[str, str]]:
    """[(speaker, text)] in order, `<|endoftext|>` removed and whitespace trimmed."""
    pieces = SPEAKER.split(chat)
    if pieces[0].strip():
        raise RowError(f"chat must start with 'USER:', found {pieces[0].strip()[:60]!r}")
    return [
        (speaker, text.replace(END_OF_TURN, "").strip())
        for speaker, text in zip(pieces[1::2], pieces[2::2])
    ]


def parse_call(text: str, where: str) -> dict:
    """One `<functioncall>` body: JSON, or JSON but for single-quoted arguments."""
    text = text.strip()
    try:
        call = json.loads(text, strict=False)
    except json.JSONDecodeError:
        quoted = QUOTED_ARGUMENTS.fullmatch(text)
        if quoted is None:
            raise RowError(
                f'{where}: {CALL_TAG} is not {{"name": ..., "arguments": ...}}: {text[:80]!r}'
            ) from None
        call = {"name": json.loads(quoted["name"]), "arguments": quoted["arguments"]}
    return tool_call(call, where)
