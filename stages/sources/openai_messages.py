"""OpenAI chat messages: `{"messages": [{"role", "content", ...}], "tools"?}` (UltraChat 200k:
`prompt, prompt_id, messages`).

`content` may be a string or a list of text parts; assistant turns may carry `tool_calls`, tool
turns a `tool_call_id`. `developer` (OpenAI's newer name for system) is read as system.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .conversation import Conversation, Turns, json_value, row_id, tool_call, tools_list
from .rows import RowError, json_type, require

ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def parse_row(record: Mapping) -> Conversation:
    turns = Turns()
    add_messages(turns, require(record, "messages", (list, str)), "messages")
    return Conversation(
        row_id(record, "prompt_id", "id"), turns.build(), tools_list(record.get("tools"))
    )


def add_messages(turns: Turns, messages: Any, where: str) -> None:
    """Append OpenAI messages (a list, or the JSON string of one) to `turns`."""
    messages = json_value(messages, where)
    if not isinstance(messages, list):
        raise RowError(f"{where} is {json_type(messages)}, expected a list of messages")
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(message, Mapping):
            raise RowError(
                f"{at} is {json_type(message)}, expected an object with role and content"
            )
        role = require(message, "role", str, at)
        if role not in ROLES:
            raise RowError(f"{at}: unknown role {role!r}; expected one of {', '.join(ROLES)}")
        role = ROLES[role]
        if role == "assistant":
            calls = json_value(message.get("tool_calls"), f"{at}.tool_calls") or []
            if not isinstance(calls, list):
                raise RowError(f"{at}.tool_calls is {json_type(calls)}, expected a list")
            calls = [tool_call(call, f"{at}.tool_calls[{j}]") for j, call in enumerate(calls)]
            turns.assistant(_text(message, at, optional=True), calls)
        elif role == "tool":
            turns.tool(_text(message, at), message.get("tool_call_id"), message.get("name"), at)
        else:
            getattr(turns, role)(_text(message, at))


def _text(message: Mapping, where: str, optional: bool = False) -> str:
    """The message's content as one string; text parts are joined, other parts refused."""
    if optional and message.get("content") is None:
        return ""
    content = require(message, "content", (str, list), where)
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, Mapping) else json_type(part)
            raise RowError(f"{where}.content[{j}] is a {kind!r} part; only text parts are read")
        texts.append(require(part, "text", str, f"{where}.content[{j}]"))
    return "".join(texts)
