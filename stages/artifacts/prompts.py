"""The prompts artifact, data/prompts/<d>.parquet: what prep writes and generate reads.

One row per sample: its id, the source messages and tools its prompt was rendered from, the
prompt ids of its first turn, whether that prompt opened reasoning, `turn_deltas`: for
`regenerate: all_turns`, the ids the template adds after each turn's output for the next turn
(empty otherwise), and `turn_messages`: for `regenerate: all_turns_rendered`, per turn the JSON
of the source messages that come before it (turn 1: the conversation up to its question; turn
k+1: the user turn or tool results after the target's turn k), from which generate renders each
later prompt (empty otherwise). The file's metadata carries what generate needs for the turns it
builds itself: the regenerate mode and the prompt limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..runtime.files import write_parquet

PROMPTS_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("dataset", pa.string()),
        ("messages", pa.string()),
        ("tools", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("prompt_len", pa.int32()),
        ("reasoning_open", pa.bool_()),
        ("turn_deltas", pa.list_(pa.list_(pa.int32()))),
        ("turn_messages", pa.list_(pa.string())),
    ]
)


@dataclass(frozen=True)
class PromptSettings:
    regenerate: str = "last_turn"  # last_turn | all_turns | all_turns_rendered
    max_prompt_tokens: int | None = None  # no later turn's prompt may be longer

    @property
    def all_turns(self) -> bool:
        """Every turn, each later prompt built from the ids before it (concatenated)."""
        return self.regenerate == "all_turns"

    @property
    def rendered(self) -> bool:
        """Every turn, each later prompt rendered by the chat template from the conversation."""
        return self.regenerate == "all_turns_rendered"

    @property
    def every_turn(self) -> bool:
        """Every assistant turn is regenerated, in order (either way of building prompts)."""
        return self.all_turns or self.rendered


def write_prompts(rows: list[dict], path: Path, settings: PromptSettings) -> None:
    schema = PROMPTS_SCHEMA.with_metadata(
        {"regenerate": settings.regenerate, "max_prompt_tokens": str(settings.max_prompt_tokens)}
    )
    write_parquet(pa.Table.from_pylist(rows, schema=schema), path)


def read_prompts(path: Path) -> tuple[pa.Table, PromptSettings]:
    """The prompts and their settings (a file written without them: last_turn, no limit)."""
    table = pq.read_table(path)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    limit = meta.get("max_prompt_tokens", "None")
    return table, PromptSettings(
        meta.get("regenerate", "last_turn"), None if limit == "None" else int(limit)
    )
