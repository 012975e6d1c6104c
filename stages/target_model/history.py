"""A conversation as a chat client holds it, rebuilt from the target's raw output ids, and the next
turn's prompt rendered from it by the chat template, as serving renders it
(`regenerate: all_turns_rendered`).

A chat client sends the whole conversation back as messages, and the server renders it with the
chat template. The target's earlier replies enter it as assistant messages built from their raw
output ids, split by token role, never by parsing text: the ids before the first end-of-reasoning
token are the `reasoning_content`, the answer before a tool-call section the `content`, and each
call of the section a structured `tool_calls` entry. Reasoning and answer are decoded exactly
(special tokens kept, no whitespace trimmed). The template then drops or keeps each reply's
reasoning as it does for every client (Kimi-K2.x: dropped up to the last reply without tool calls,
unless `preserve_thinking`), so each turn's prompt is what serving would have sent the target.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .tokenizer import render_prompt
from .tokens import TokenRoles, single_token_id

# The token between a Kimi-style call's name and its arguments (not a token role: only this
# module reads it, and only when the tokenizer has it)
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"


def reply_message(
    tokenizer, roles: TokenRoles, output_ids: Sequence[int], reasoning_open: bool
) -> dict:
    """The assistant message a chat client gets back for `output_ids`.

    `reasoning_open`: the prompt's last token opened reasoning, so the output starts inside it;
    otherwise a think token the target writes itself opens it (K2-Thinking). Reasoning that
    never closed (a reply cut at max_new_tokens) is all reasoning and no answer.
    """
    ids = list(output_ids)
    if ids and ids[-1] in roles.stop_ids:
        ids = ids[:-1]
    think, end_think = roles.think, roles.end_think
    reasoning: list[int] | None = None
    answer = ids
    start = None
    if reasoning_open:
        start = 0
    elif think is not None and think in ids:
        start = ids.index(think) + 1
    if start is not None:
        rest = ids[start:]
        if end_think is not None and end_think in rest:
            cut = rest.index(end_think)
            reasoning, answer = rest[:cut], rest[cut + 1 :]
        else:
            reasoning, answer = rest, []
    content, calls = split_tool_calls(tokenizer, roles, answer)
    message: dict = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = _decode(tokenizer, reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def split_tool_calls(
    tokenizer, roles: TokenRoles, answer: Sequence[int]
) -> tuple[str, list[dict] | None]:
    """The answer's text before its tool calls, and the calls as OpenAI `tool_calls` (None when
    it makes none).

    Kimi's form: `<|tool_calls_section_begin|>`, then per call
    `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>`,
    then `<|tool_calls_section_end|>`; the call's header is kept as its id (the template renders
    it back). Without section tokens, a call is `<tool_call>{"name", "arguments"}</tool_call>`
    (Qwen/Hermes form). Text after the calls is dropped, as a server's tool parser does; calls
    that do not parse (an unclosed block or section, a reply cut at max_new_tokens) leave the
    whole answer as content, as a server returns them.
    """
    answer = list(answer)
    whole = _decode(tokenizer, answer)
    begin, end = roles.tool_call_begin, roles.tool_call_end
    section_begin, section_end = roles.tool_section_begin, roles.tool_section_end
    opener = section_begin if section_begin is not None else begin
    if begin is None or end is None or opener is None or opener not in answer:
        return whole, None
    at = answer.index(opener)
    section = answer[at:]
    if section_begin is not None:
        if section_end is None or section_end not in section:
            return whole, None
        section = section[1 : section.index(section_end)]
    blocks = _call_blocks(section, begin, end)
    if not blocks:
        return whole, None
    argument = single_token_id(tokenizer, ARGUMENT_BEGIN)
    calls: list[dict] = []
    for block in blocks:
        if argument is not None and argument in block:
            cut = block.index(argument)
            header = _decode(tokenizer, block[:cut]).strip()
            call = _kimi_call(header, _decode(tokenizer, block[cut + 1 :]), len(calls))
        else:
            call = _json_call(_decode(tokenizer, block))
        if call is None:
            return whole, None
        calls.append(call)
    return _decode(tokenizer, answer[:at]), calls


def conversation(segments: Sequence[Sequence[dict]], replies: Sequence[dict]) -> list[dict]:
    """The messages of the conversation so far: before each turn the target wrote, the messages
    that precede it (`segments[k]`), then its reply."""
    if len(segments) != len(replies) + 1:
        raise ValueError(
            f"{len(replies)} replies need {len(replies) + 1} message segments, got {len(segments)}"
        )
    messages: list[dict] = list(segments[0])
    for reply, segment in zip(replies, segments[1:]):
        messages += [reply, *segment]
    return messages


class HistoryRenderer:
    """Renders a later turn's prompt from the conversation so far, as serving renders it."""

    def __init__(self, tokenizer, roles: TokenRoles, template_kwargs: dict):
        self.tokenizer, self.roles, self.kwargs = tokenizer, roles, template_kwargs

    def messages(
        self, segments: Sequence[Sequence[dict]], outputs: Sequence[tuple[Sequence[int], bool]]
    ) -> list[dict]:
        """The conversation with the target's replies: `outputs` are each earlier turn's
        (output ids, whether its prompt opened reasoning), `segments` the messages before each
        turn (one more than the outputs: the last ones precede the turn to render)."""
        replies = [reply_message(self.tokenizer, self.roles, ids, o) for ids, o in outputs]
        return conversation(segments, replies)

    def prompt(
        self,
        segments: Sequence[Sequence[dict]],
        tools: list | None,
        outputs: Sequence[tuple[Sequence[int], bool]],
    ) -> list[int]:
        """The prompt of the turn after `outputs`: the template's rendering of the conversation
        so far with the generation prompt."""
        return render_prompt(self.tokenizer, self.messages(segments, outputs), tools, self.kwargs)


def _call_blocks(section: list[int], begin: int, end: int) -> list[list[int]] | None:
    """The ids inside each begin..end block of `section`; None when a block is left open or
    nested."""
    blocks: list[list[int]] = []
    inside: list[int] | None = None
    for t in section:
        if t == begin:
            if inside is not None:
                return None
            inside = []
        elif t == end:
            if inside is None:
                return None
            blocks.append(inside)
            inside = None
        elif inside is not None:
            inside.append(t)
    return None if inside is not None else blocks


def _kimi_call(header: str, arguments: str, index: int) -> dict | None:
    """`functions.NAME:IDX` and its argument text as an OpenAI call, the header kept as its id."""
    name = header.split(".", 1)[1] if header.startswith("functions.") else header
    name = name.rsplit(":", 1)[0] if ":" in name else name
    if not name:
        return None
    call_id = header if header.startswith("functions.") else f"functions.{name}:{index}"
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _json_call(body: str) -> dict | None:
    try:
        spec = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return None
    arguments = spec.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"type": "function", "function": {"name": spec["name"], "arguments": text}}


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)
