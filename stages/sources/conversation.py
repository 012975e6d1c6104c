"""The canonical conversation every adapter produces, and the pieces adapters build it from.

Messages are OpenAI-style dicts: `{"role": "system" | "user" | "assistant" | "tool", "content":
str}`. An assistant message may carry `tool_calls` (`[{"id", "type": "function", "function":
{"name", "arguments": JSON string}}]`); a tool message carries the `tool_call_id` and `name` of
the call it answers. An assistant message with content None is a reply the source leaves for the
target to write (MT-bench's second question follows an answer the dataset does not have).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .rows import RowError, json_type, require


@dataclass(frozen=True)
class Conversation:
    source_id: str  # the row's own id, else a short hash of the row
    messages: list[dict]  # the whole conversation, canonical messages
    tools: list[dict] | None  # [{"type": "function", "function": {name, description, parameters}}]


ANSWERED_ROLES = ("user", "tool")  # the messages an assistant turn replies to


def is_unwritten(message: dict) -> bool:
    """A reply the source does not have, for the target to write."""
    return message["role"] == "assistant" and message["content"] is None


def prompt_messages(messages: list[dict]) -> list[dict]:
    """The prompt for regenerating the last turn: the conversation up to and including its last
    user turn or tool result before any reply the source lacks, so the target writes the reply
    that follows."""
    known = next((i for i, m in enumerate(messages) if is_unwritten(m)), len(messages))
    return messages[: _through_last_question(messages, 0, known)]


def turn_bounds(messages: list[dict]) -> list[tuple[int, int]]:
    """The messages the target reads before each turn it writes, when it rewrites every
    assistant turn in order: turn k's prompt adds `messages[start:end]` of bound k after the
    target's own turn k-1, and the source's turn from one bound's end to the next one's start is
    the turn the target's replaces.

    A turn is a run of assistant messages after a user turn or tool result. A turn followed by a
    tool result is kept as the source has it (context, not rewritten): the result answers the
    source's call, not the one the target would make, so the target answers the result instead.
    The source's reply after the last user turn or tool result is dropped, as in
    `prompt_messages`.
    """
    bounds, start, i = [], 0, 0
    while i < len(messages):
        if messages[i]["role"] != "assistant":
            i += 1
            continue
        end = next(
            (j for j in range(i, len(messages)) if messages[j]["role"] != "assistant"),
            len(messages),
        )
        replies = i > start and messages[i - 1]["role"] in ANSWERED_ROLES
        if replies and not (end < len(messages) and messages[end]["role"] == "tool"):
            bounds.append((start, i))
            start = end
        elif any(is_unwritten(m) for m in messages[i:end]):
            raise ValueError(
                f"message {i} is a reply left to the target, but it does not "
                "answer a user turn, or a tool result follows it"
            )
        i = end
    if start < len(messages):
        last = _through_last_question(messages, start, len(messages), required=not bounds)
        if last > start:
            bounds.append((start, last))
    return bounds


def _through_last_question(
    messages: list[dict], start: int, end: int, required: bool = True
) -> int:
    """The end of `messages[start:end]` cut after its last user turn or tool result."""
    last = max(
        (i for i in range(start, end) if messages[i]["role"] in ANSWERED_ROLES), default=None
    )
    if last is None:
        if required:
            raise ValueError("the conversation has no user turn or tool result to reply to")
        return start
    return last + 1


def row_id(record: Mapping, *id_fields: str) -> str:
    """The row's own id from the first of `id_fields` it holds, else a short sha256 of the row's
    canonical JSON (stable across runs and file order)."""
    for name in id_fields:
        if record.get(name) is not None:
            return id_text(record, name)
    canonical = json.dumps(
        record, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def id_text(record: Mapping, name: str) -> str:
    """record[name] as an id: a non-empty string or an integer."""
    value = require(record, name, (str, int))
    if value == "":
        raise RowError(f"field {name!r} is an empty id")
    return str(value)


def json_value(value: Any, where: str) -> Any:
    """A value that datasets store either decoded or as a JSON string (tools, messages, calls)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise RowError(f"{where} is a string but not valid JSON ({err})") from None


def tools_list(value: Any, where: str = "tools") -> list[dict] | None:
    """Function definitions, bare (`{name, description, parameters}`) or OpenAI-wrapped, as
    OpenAI tools; None when there are none."""
    value = json_value(value, where)
    if value in (None, "", []):
        return None
    if not isinstance(value, list):
        raise RowError(f"{where} is {json_type(value)}, expected a list of function definitions")
    return [
        {"type": "function", "function": _function(spec, f"{where}[{i}]")}
        for i, spec in enumerate(value)
    ]


def _function(spec: Any, where: str) -> dict:
    if not isinstance(spec, Mapping):
        raise RowError(f"{where} is {json_type(spec)}, expected a function definition object")
    function = spec["function"] if isinstance(spec.get("function"), Mapping) else spec
    require(function, "name", str, where)
    return {key: value for key, value in function.items() if value is not None}


def tool_call(spec: Any, where: str) -> dict:
    """One call, OpenAI-shaped (`{id?, function: {name, arguments}}`) or flat (`{name,
    arguments}`). `arguments`, a JSON object or its text, is decoded and written back with
    json.dumps, so every source spells arguments the same way."""
    if not isinstance(spec, Mapping):
        raise RowError(f"{where} is {json_type(spec)}, expected a tool call object")
    function = spec["function"] if isinstance(spec.get("function"), Mapping) else spec
    name = require(function, "name", str, where)
    arguments = function.get("arguments")
    if arguments in (None, ""):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments, strict=False)  # raw newlines in strings occur
        except json.JSONDecodeError as err:
            raise RowError(f"{where}: arguments of {name!r} are not valid JSON ({err})") from None
    if not isinstance(arguments, Mapping):
        raise RowError(
            f"{where}: arguments of {name!r} are {json_type(arguments)}, expected a JSON object"
        )
    call_id = spec.get("id")
    if call_id is not None and not isinstance(call_id, str):
        raise RowError(f"{where}: id is {json_type(call_id)}, expected a string")
    return {
        "id": call_id or None,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


class Turns:
    """Builds canonical messages turn by turn.

    Empty user, system and plain assistant turns are dropped (they carry nothing a template should
    render). A call without an id is named `functions.<name>:<index>`, the form Kimi-K2 templates
    render (other templates ignore ids). A tool result without a `tool_call_id` answers the oldest
    open call; a user turn closes the calls still open.
    """

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self._open_calls: list[dict] = []
        self._calls_made = 0

    def system(self, text: str) -> None:
        self._say("system", text)

    def user(self, text: str) -> None:
        self._open_calls.clear()
        self._say("user", text)

    def assistant(self, text: str, calls: Sequence[dict] = ()) -> None:
        if not calls:
            self._say("assistant", text)
            return
        named = [self._named(call) for call in calls]
        self.messages.append({"role": "assistant", "content": text, "tool_calls": named})
        self._open_calls.extend(named)

    def unwritten_reply(self) -> None:
        """A reply the source does not have: the target writes it when it rewrites every turn."""
        self.messages.append({"role": "assistant", "content": None})

    def tool(
        self,
        text: str,
        call_id: str | None = None,
        name: str | None = None,
        where: str = "tool result",
    ) -> None:
        call = self._answered_call(call_id, where)
        self.messages.append(
            {
                "role": "tool",
                "content": text,
                "tool_call_id": call["id"],
                "name": name or call["function"]["name"],
            }
        )

    def build(self) -> list[dict]:
        if not any(message["role"] == "user" for message in self.messages):
            raise RowError("the conversation has no non-empty user turn")
        return self.messages

    def _say(self, role: str, text: str) -> None:
        if text.strip():
            self.messages.append({"role": role, "content": text})

    def _named(self, call: dict) -> dict:
        call_id = call["id"] or f"functions.{call['function']['name']}:{self._calls_made}"
        self._calls_made += 1
        return {**call, "id": call_id}

    def _answered_call(self, call_id: str | None, where: str) -> dict:
        for i, call in enumerate(self._open_calls):
            if call_id is None or call["id"] == call_id:
                return self._open_calls.pop(i)
        if call_id is None:
            raise RowError(
                f"{where} answers no open tool call; a tool result must follow the "
                "assistant turn that made the call"
            )
        raise RowError(f"{where} answers call id {call_id!r}, which no open tool call has")
