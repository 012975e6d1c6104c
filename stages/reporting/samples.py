"""Sample records for people: generated turns decoded with the target's tokenizer, the prompt's
end and each part of the reply (by token role) apart, special tokens marked."""

from __future__ import annotations

from ..target_model.tokens import TokenRoles
from .anatomy import decode_marked, split_reply
from .page import SampleView


def sample_views(
    records: list[dict], tokenizer, roles: TokenRoles, prompt_tokens: int
) -> list[SampleView]:
    """One view per raw row (the `sample_records` question's columns); `prompt_tokens`: how much
    of the prompt's end is shown."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    special |= {v for v in roles.as_dict().values() if v is not None}

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    views = []
    for r in records:
        prompt = list(r["prompt_ids"])
        cut = len(prompt) > prompt_tokens
        shown = decode_marked(prompt[-prompt_tokens:] if cut else prompt, decode, special)
        facts: dict = {
            "prompt tokens": r["prompt_len"],
            "reasoning tokens": r["reasoning_tokens"]
            if r["reasoning_tokens"] is not None
            else "never closed",
            "answer tokens": r["answer_tokens"],
            "tool calls": r["tool_calls"],
        }
        if not r["tool_calls_balanced"]:
            facts["tool calls"] = f"{r['tool_calls']} (one left open)"
        views.append(
            SampleView(
                sample_id=r["sample_id"],
                dataset=r["dataset"],
                turn=r["turn"],
                finish_reason=r["finish_reason"],
                facts=facts,
                prompt=([("…", False)] if cut else []) + shown,
                parts=[
                    (p.kind, len(p.ids), decode_marked(p.ids, decode, special))
                    for p in split_reply(r["output_ids"], roles, bool(r["reasoning_open"]))
                ],
            )
        )
    return views
