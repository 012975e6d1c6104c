"""ShareGPT: `{"id", "conversations": [{"from", "value"}, ...]}`.

Also LLaMA-Factory's ShareGPT variant, which Glaive's converted function-calling data uses: turns
`function_call` (a JSON call, or a list of them, made by the assistant) and `observation` (the
tool's result), an optional `system` string and `tools` (a JSON string of function definitions).
Turns are kept in their order, a leading assistant turn included; empty turns are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

from .conversation import Conversation, Turns, json_value, row_id, tool_call, tools_list
from .rows import RowError, json_type, require

# ShareGPT dumps name the assistant after the product the chat was shared from.
SPEAKERS = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "system": "system",
    "function_call": "call",
    "observation": "tool",
    "tool": "tool",
}


def parse_row(record: Mapping) -> Conversation:
    turns = Turns()
    system = record.get("system")
    if system is not None:
        turns.system(require(record, "system", str))
    for i, turn in enumerate(require(record, "conversations", list)):
        where = f"conversations[{i}]"
        if not isinstance(turn, Mapping):
            raise RowError(f"{where} is {json_type(turn)}, expected an object with from and value")
        speaker = require(turn, "from", str, where)
        text = require(turn, "value", str, where)
        role = SPEAKERS.get(speaker.lower())
        if role is None:
            raise RowError(
                f"{where}: unknown speaker {speaker!r}; expected one of {', '.join(SPEAKERS)}"
            )
        if role == "call":
            calls = json_value(text, where)
            calls = calls if isinstance(calls, list) else [calls]
            turns.assistant("", [tool_call(call, where) for call in calls])
        elif role == "tool":
            turns.tool(text, where=where)
        else:
            getattr(turns, role)(text)
    return Conversation(row_id(record, "id"), turns.build(), tools_list(record.get("tools")))
