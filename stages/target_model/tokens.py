"""Token roles (reasoning, tool calls, end of turn) learned from the tokenizer, by token string.

Reasoning, answer and tool calls are found by token ids, never by parsing decoded text: this is
what keeps a parser from silently dropping reasoning. the caller can override any role.
"""

from __future__ import annotations

from dataclasses import dataclass

# Candidate strings per role, in order of preference (Kimi-K2.x, Qwen3/DeepSeek, Llama, Gemma...).
ROLE_CANDIDATES: dict[str, tuple[str, ...]] = {
    "think": ("<think>",),
    "end_think": ("</think>",),
    "tool_call_begin": ("<|tool_call_begin|>", "<tool_call>"),
    "tool_call_end": ("<|tool_call_end|>", "</tool_call>"),
    "tool_section_begin": ("<|tool_calls_section_begin|>",),
    "tool_section_end": ("<|tool_calls_section_end|>",),
    "end_of_turn": ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"),
}


@dataclass(frozen=True)
class TokenRoles:
    """Token id per role; None when the tokenizer has no such token."""

    think: int | None
    end_think: int | None
    tool_call_begin: int | None
    tool_call_end: int | None
    tool_section_begin: int | None
    tool_section_end: int | None
    end_of_turn: int | None
    eos: int | None

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end a generated turn, sent explicitly to every engine."""
        return sorted({i for i in (self.end_of_turn, self.eos) if i is not None})

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def single_token_id(tokenizer, text: str) -> int | None:
    """The id of `text` when the tokenizer holds it as one token, else None."""
    tid = tokenizer.convert_tokens_to_ids(text)
    if tid is None or (tid == tokenizer.unk_token_id and text != tokenizer.unk_token):
        return None
    return tid


def learn_roles(tokenizer, overrides: dict | None = None) -> TokenRoles:
    """Each role's token, found by string; `overrides`: role -> token string (None unsets it)."""
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(ROLE_CANDIDATES)
    if unknown:
        raise ValueError(
            f"roles: unknown role(s) {sorted(unknown)}; known roles: {sorted(ROLE_CANDIDATES)}"
        )
    found = {}
    for role, candidates in ROLE_CANDIDATES.items():
        if role in overrides:
            text = overrides[role]
            tid = None if text is None else single_token_id(tokenizer, text)
            if text is not None and tid is None:
                raise ValueError(
                    f"roles.{role}: {text!r} is not a single token of the "
                    f"tokenizer; give a token string from its vocabulary"
                )
            found[role] = tid
            continue
        found[role] = next(
            (t for t in map(lambda c: single_token_id(tokenizer, c), candidates) if t is not None),
            None,
        )
    return TokenRoles(**found, eos=tokenizer.eos_token_id)


@dataclass(frozen=True)
class OutputAnatomy:
    """What a generated reply consists of, derived from its ids alone."""

    reasoning_tokens: int | None  # tokens before the first end-of-reasoning; None if never closed
    answer_tokens: int
    tool_calls: int  # complete tool-call blocks
    tool_calls_balanced: bool  # every opened call / section closed, in order


def analyze_output(output_ids: list[int], roles: TokenRoles, reasoning_open: bool) -> OutputAnatomy:
    """Split a reply into reasoning / answer and count tool calls.

    `reasoning_open` is True when the prompt's last token opened reasoning (the template appended
    the think token, so the model never generates it); a reply that emits the think token itself
    opens reasoning too.
    """
    ids = list(output_ids)
    if ids and ids[-1] in roles.stop_ids:
        ids = ids[:-1]
    opened = reasoning_open or (roles.think is not None and roles.think in ids)
    reasoning = None
    answer = ids
    if opened and roles.end_think is not None and roles.end_think in ids:
        cut = ids.index(roles.end_think)
        reasoning = cut
        answer = ids[cut + 1 :]
    elif opened:
        answer = []
    calls, balanced = _count_blocks(answer, roles.tool_call_begin, roles.tool_call_end)
    _, sections_balanced = _count_blocks(answer, roles.tool_section_begin, roles.tool_section_end)
    return OutputAnatomy(reasoning, len(answer), calls, balanced and sections_balanced)


def _count_blocks(ids: list[int], begin: int | None, end: int | None) -> tuple[int, bool]:
    """Complete begin..end blocks, and whether every block opened was closed without nesting."""
    if begin is None or end is None:
        return 0, True
    depth = complete = 0
    balanced = True
    for t in ids:
        if t == begin:
            balanced &= depth == 0
            depth += 1
        elif t == end:
            if depth == 0:
                balanced = False
                continue
            depth -= 1
            complete += 1
    return complete, balanced and depth == 0
