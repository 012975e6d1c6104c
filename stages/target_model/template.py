"""What the chat template must do for the prompt ids to be right, checked on every prompt prep
renders.

Every generation prompt ends the way the dataset expects: it opens reasoning (or leaves it to
the target) when reasoning is expected, does not open it when it is not, and
opens the assistant's turn instead of stopping after a closed one. A template switch left at the
wrong value would otherwise cost a whole generation run before the quality gate saw it.

For `regenerate: all_turns` (ids concatenated) the template must also render a conversation as
its turns concatenated, the target's replies as the target wrote them: the generation prompt is
how it begins an assistant turn, a reply held as a message (reasoning_content + content) renders
as the ids the target emits for it (reasoning, end of reasoning, answer, end of turn), and adding
messages leaves the turns before them as they were. Then each later turn's prompt is built from
ids alone (engines/turns.py): the previous prompt, the previous output and the ids the template
adds for the next messages, which `ChatTemplate.plan` computes before anything is generated. A
template that drops earlier reasoning (Kimi-K2.x, Qwen3) fails here: use `all_turns_rendered`,
whose later prompts the template renders at generate time (target/history.py), or `last_turn`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tokenizer import render_prompt
from .tokens import TokenRoles

REGENERATE_MODES = ("last_turn", "all_turns", "all_turns_rendered")


class TemplateError(ValueError):
    """The chat template cannot give the prompts the dataset needs; says what to change.

    `settings` names what the caller can change: expect_reasoning, regenerate, template_kwargs,
    chat_template, roles (the stage turns them into its params keys)."""

    def __init__(self, message: str, settings: tuple[str, ...]):
        super().__init__(message)
        self.settings = settings


@dataclass(frozen=True)
class TurnPlan:
    """A conversation's ids before any turn is generated."""

    prompt_ids: list[int]  # turn 1's prompt
    # all_turns, per later turn: what follows the previous turn's end-of-turn token (empty in the
    # other modes: all_turns_rendered renders each later prompt when the turn before is back)
    deltas: list[list[int]]


class ChatTemplate:
    """The target's chat template as prep renders one dataset's prompts with it."""

    def __init__(
        self,
        tokenizer,
        roles: TokenRoles,
        template_kwargs: dict,
        template_name: str,
        expect_reasoning: bool,
        regenerate: str = "last_turn",
    ):
        if regenerate not in REGENERATE_MODES:
            raise ValueError(f"regenerate: {regenerate!r} is not one of {list(REGENERATE_MODES)}")
        self.tokenizer, self.roles, self.kwargs = tokenizer, roles, template_kwargs
        self.name, self.expect_reasoning = template_name, expect_reasoning
        self.concatenated = regenerate == "all_turns"  # later prompts built from ids
        # a reply the target has not written yet: only the ids around it are kept
        self.placeholder = {"role": "assistant", "content": "reply"}
        if expect_reasoning:
            self.placeholder["reasoning_content"] = "thought"
            if roles.think is None or roles.end_think is None:
                raise TemplateError(
                    f"reasoning is expected, but the tokenizer has no reasoning tokens to find "
                    f"it by (think {roles.think}, end_think {roles.end_think}): name them in the "
                    f"token roles, or expect no reasoning",
                    ("roles", "expect_reasoning"),
                )
        if self.concatenated and roles.end_of_turn is None:
            raise TemplateError(
                "regenerating all turns closes each turn with the end-of-turn token, and the "
                "tokenizer has none: name it in the token roles (end_of_turn), or regenerate the "
                "last turn only",
                ("roles", "regenerate"),
            )

    def plan(self, segments: list[list[dict]], tools: list | None) -> TurnPlan:
        """Turn 1's prompt and the ids each later turn adds (all_turns), every generation prompt
        checked.

        `segments[k]` are the messages between the target's turn k-1 and its turn k
        (sources.turn_bounds); a placeholder reply stands for each turn the target writes.
        """
        history = list(segments[0])
        prompt = self._generation_prompt(history, tools)
        first, deltas = prompt, []
        for segment in segments[1:]:
            if not self.concatenated:  # every later generation prompt still ends as promised
                history += [self.placeholder, *segment]
                prompt = self._generation_prompt(history, tools)
                continue
            replied = render_prompt(
                self.tokenizer, [*history, self.placeholder], tools, self.kwargs, generation=False
            )
            end = self._end_of_reply(prompt, replied)
            self._check_reply_as_written(prompt, replied[len(prompt) : end + 1])
            history += [self.placeholder, *segment]
            prompt = self._generation_prompt(history, tools)
            if prompt[: len(replied)] != replied:
                at = common_prefix(replied, prompt)
                raise self._not_concatenated(
                    f"adding the next messages changes how the turns before them render (does it "
                    f"drop earlier reasoning?): from token {at}, "
                    f"{self._text(replied[at : at + 12])} becomes "
                    f"{self._text(prompt[at : at + 12])}"
                )
            deltas.append(prompt[end + 1 :])
        return TurnPlan(first, deltas)

    def _generation_prompt(self, messages: list[dict], tools: list | None) -> list[int]:
        """The prompt for the reply after `messages`, checked to end as the dataset expects."""
        ids = render_prompt(self.tokenizer, messages, tools, self.kwargs)
        bare = render_prompt(self.tokenizer, messages, tools, self.kwargs, generation=False)
        added = ids[common_prefix(ids, bare) :]
        problem = self._ending_problem(ids, added)
        if problem:
            raise TemplateError(
                f"the generation prompt ends with {self._text(added or ids[-4:])}: {problem[0]}",
                problem[1],
            )
        return ids

    def _ending_problem(
        self, ids: list[int], added: list[int]
    ) -> tuple[str, tuple[str, ...]] | None:
        think, end_think = self.roles.think, self.roles.end_think
        opens = think in added and (
            end_think not in added or last_index(added, think) > last_index(added, end_think)
        )
        closes = end_think in added and not opens
        if self.expect_reasoning and closes:
            return (
                f"{self.name} closes reasoning before the reply, but reasoning is expected, "
                f"so the prompt must open reasoning or leave it to the target. Turn thinking "
                f"on in the template kwargs (e.g. {{thinking: true}}) or the chat template, "
                f"or expect no reasoning",
                ("template_kwargs", "chat_template", "expect_reasoning"),
            )
        if not self.expect_reasoning and opens:
            return (
                f"{self.name} opens reasoning, but no reasoning is expected, so the prompt "
                f"must not. Expect reasoning, or turn thinking off in the template kwargs "
                f"(e.g. {{thinking: false}}) or the chat template",
                ("expect_reasoning", "template_kwargs", "chat_template"),
            )
        if not added and ids[-1] == self.roles.end_of_turn:
            return (
                f"{self.name} adds nothing for the reply (does it ignore "
                f"add_generation_prompt?), so the target would write after a closed turn; the "
                f"prompt must open the assistant's turn: fix the chat template",
                ("chat_template",),
            )
        return None

    def _end_of_reply(self, prompt: list[int], replied: list[int]) -> int:
        """Where the placeholder reply's end-of-turn token is in `replied`."""
        if replied[: len(prompt)] != prompt:
            at = common_prefix(prompt, replied)
            raise self._not_concatenated(
                f"its generation prompt ends with {self._text(prompt[at:])}, but it begins an "
                f"assistant turn with {self._text(replied[at : len(prompt)])}"
            )
        reply, end_of_turn = replied[len(prompt) :], self.roles.end_of_turn
        if end_of_turn is None:  # __init__ requires one when all turns are regenerated
            raise self._not_concatenated("the tokenizer has no end-of-turn token")
        if end_of_turn not in reply:
            raise self._not_concatenated(
                f"it ends an assistant turn with {self._text(reply[-4:])}, not with the "
                f"end-of-turn token {self._text([end_of_turn])}"
            )
        return len(prompt) + last_index(reply, end_of_turn)

    def emitted_reply(self, prompt: list[int]) -> list[int]:
        """The placeholder reply as the target emits it after `prompt`, built from ids: its
        reasoning, the end-of-reasoning token, its answer and the end-of-turn token (and the think
        token first when the prompt leaves opening reasoning to the target)."""
        roles = self.roles
        if roles.end_of_turn is None:  # __init__ requires one when all turns are regenerated
            raise self._not_concatenated("the tokenizer has no end-of-turn token")
        ids: list[int] = []
        if self.expect_reasoning and roles.think is not None and roles.end_think is not None:
            if not opens_reasoning(prompt, roles.think, roles.end_think):
                ids.append(roles.think)
            ids += self._encode(self.placeholder["reasoning_content"]) + [roles.end_think]
        return ids + self._encode(self.placeholder["content"]) + [roles.end_of_turn]

    def _check_reply_as_written(self, prompt: list[int], rendered: list[int]) -> None:
        """The template renders a reply held as a message as the ids the target wrote for it;
        else the next turn's concatenated prompt holds ids no server renders."""
        emitted = self.emitted_reply(prompt)
        if rendered == emitted:
            return
        at = common_prefix(emitted, rendered)
        raise TemplateError(
            f"regenerate: all_turns builds each turn's prompt from the ids of the turns before "
            f"it, the target's replies as it wrote them, but {self.name} renders a reply "
            f"differently from how the target writes it (does it drop the reasoning of earlier "
            f"replies?): after the generation prompt the target writes {self._text(emitted)}, "
            f"and the template renders that reply as {self._text(rendered)}; the first ids that "
            f"differ, at token {len(prompt) + at} of the next turn's prompt: written "
            f"{emitted[at : at + 8]} ({self._text(emitted[at : at + 8])}), rendered "
            f"{rendered[at : at + 8]} ({self._text(rendered[at : at + 8])}). Regenerate every "
            f"turn with each prompt rendered by the template as serving renders it (regenerate: "
            f"all_turns_rendered), or the last turn only (regenerate: last_turn)",
            ("regenerate", "chat_template", "template_kwargs"),
        )

    def _not_concatenated(self, detail: str) -> TemplateError:
        return TemplateError(
            f"regenerate: all_turns builds each turn's prompt from the ids of the turns before "
            f"it, which needs a template that renders a conversation as its turns concatenated, "
            f"and {self.name} does not: {detail}. Regenerate every turn with each prompt rendered "
            f"by the template (regenerate: all_turns_rendered), or the last turn only "
            f"(regenerate: last_turn), or give a template that renders earlier turns unchanged",
            ("regenerate", "chat_template", "template_kwargs"),
        )

    def _text(self, ids: list[int]) -> str:
        return repr(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many ids `a` and `b` share from the start."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def opens_reasoning(ids: list[int], think: int, end_think: int) -> bool:
    """Whether `ids` leave reasoning open: a think token after the last end-of-reasoning one."""
    return think in ids and (
        end_think not in ids or last_index(ids, think) > last_index(ids, end_think)
    )


def last_index(ids: list[int], token: int) -> int:
    return len(ids) - 1 - ids[::-1].index(token)
