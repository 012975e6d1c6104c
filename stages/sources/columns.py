"""Any JSON / JSON Lines / Parquet file, read through a mapping from roles to its column names.

    {"prompt": "question", "response": "answer", "system": "sys", "id": "uid"}
    {"messages": "dialog", "tools": "functions"}

`prompt` (a user turn) or `messages` (OpenAI messages, or their JSON string) is required;
`response` goes with `prompt`. A mapped column must exist in every row; `system`, `response` and
`tools` may be null in a row, which then has none. Without `id`, a row's id is a hash of the row.
The fixed single-turn formats (code_instruct, benchmarks) are mappings too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .conversation import Conversation, Turns, id_text, row_id, tools_list
from .openai_messages import add_messages
from .rows import require


@dataclass(frozen=True)
class ColumnMapping:
    prompt: str | None = None
    response: str | None = None
    system: str | None = None
    messages: str | None = None
    tools: str | None = None
    id: str | None = None

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("a column mapping needs exactly one of 'prompt' or 'messages'")
        if self.response is not None and self.prompt is None:
            raise ValueError("'response' goes with 'prompt'; a 'messages' column holds the replies")

    @classmethod
    def from_dict(cls, mapping: Mapping[str, str] | None) -> ColumnMapping:
        """Checks keys and values, naming the bad one: params.yaml errors surface here."""
        known = [f.name for f in fields(cls)]
        if not isinstance(mapping, Mapping) or not mapping:
            raise ValueError(
                f"format 'columns' needs a mapping of {', '.join(known)} to column "
                "names, e.g. {prompt: question, response: answer}"
            )
        for key, column in mapping.items():
            if key not in known:
                raise ValueError(f"unknown column mapping key {key!r}; expected {', '.join(known)}")
            if not isinstance(column, str) or not column:
                raise ValueError(f"column mapping {key!r} must name a column, got {column!r}")
        return cls(**mapping)

    def __call__(self, record: Mapping) -> Conversation:
        turns = Turns()
        if (system := _optional(record, self.system, str)) is not None:
            turns.system(system)
        if self.messages is not None:
            add_messages(turns, require(record, self.messages, (list, str)), self.messages)
        elif self.prompt is not None:
            turns.user(require(record, self.prompt, str))
            if (response := _optional(record, self.response, str)) is not None:
                turns.assistant(response)
        else:  # __post_init__ lets no mapping through without one of them
            raise ValueError("a column mapping needs exactly one of 'prompt' or 'messages'")
        tools = tools_list(_optional(record, self.tools, list, str), self.tools or "tools")
        source_id = row_id(record) if self.id is None else id_text(record, self.id)
        return Conversation(source_id, turns.build(), tools)


def _optional(record: Mapping, column: str | None, *kinds: type) -> Any:
    """The value of an optional role's column: None when unmapped or null in this row."""
    return None if column is None else require(record, column, (*kinds, type(None)))
