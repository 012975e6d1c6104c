"""The turns generate asks the engine for: each sample's first turn, and with `regenerate:
all_turns` or `all_turns_rendered` every later one, as soon as the turn before it is back.

all_turns (ids concatenated): turn k+1's prompt is turn k's prompt, turn k's output ids as
generated (with the end-of-turn token appended when it stopped without one) and the ids the
template adds for the next messages (prep's `turn_deltas`). Nothing is decoded and encoded again,
so every reply's context is exactly the ids the target was given, and each turn's prompt and
output are the start of every later turn's prompt: the merge stage builds a sample's sequence
from its last turn alone.

all_turns_rendered: turn k+1's prompt is what a chat client and a server would send: the chat
template's rendering of the conversation so far, the target's earlier replies held as messages
built from their output ids. The caller's `render` callback builds it (target/history.py), so
this module needs no tokenizer; each turn is then its own training sequence.

A conversation stops after a failed turn, and before a turn whose prompt would be longer than
the prompt limit (counted as `stopped_at_prompt_limit`). Later turns go before new samples, so a
conversation's prefix is still in the server's cache and a kill leaves few conversations halfway.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..artifacts.prompts import PromptSettings
from ..target_model.tokens import TokenRoles
from . import Completion

# an earlier turn as the renderer needs it: (output ids, whether its prompt opened reasoning)
Output = tuple[list[int], bool]
# (prompts row, the sample's turns so far) -> the next turn's prompt ids (all_turns_rendered)
RenderPrompt = Callable[[dict, list[Output]], list[int]]


def next_turn_prompt(
    prompt_ids: list[int], output_ids: list[int], delta: list[int], end_of_turn: int
) -> list[int]:
    """Turn k+1's prompt from turn k's prompt and output and the template's ids between them."""
    closed = output_ids if output_ids[-1:] == [end_of_turn] else [*output_ids, end_of_turn]
    return [*prompt_ids, *closed, *delta]


@dataclass
class Sample:
    """One prompts row and the last of its turns generated so far."""

    row: dict
    turns: int = 0  # turns generated
    last: dict | None = None  # the last turn: prompt_ids, output_ids, finish_reason
    outputs: list[Output] = field(default_factory=list)  # all_turns_rendered: every turn so far
    stopped_at_limit: bool = False

    @property
    def planned_turns(self) -> int:
        deltas, segments = self.row.get("turn_deltas") or [], self.row.get("turn_messages") or []
        return max(1 + len(deltas), len(segments))


class TurnQueue:
    """Hands out the requests that are ready and turns completions into raw rows.

    `done` holds, per sample id, the number of turns already stored and the last of them (a
    resumed run continues every conversation where it stopped); with all_turns_rendered the last
    one also holds `outputs`, every stored turn's (output ids, reasoning_open), and `render`
    builds each later prompt from them.
    """

    def __init__(
        self,
        prompts: list[dict],
        done: dict[str, tuple[int, dict]],
        settings: PromptSettings,
        roles: TokenRoles,
        render: RenderPrompt | None = None,
    ):
        if settings.rendered and render is None:
            raise ValueError("regenerate: all_turns_rendered needs a renderer of later prompts")
        self.settings, self.roles, self.render = settings, roles, render
        self.samples = {r["sample_id"]: Sample(r) for r in prompts}
        self.ready: deque[tuple[Sample, list[int]]] = deque()  # later turns, before new samples
        for sample_id, (turns, last) in done.items():
            sample = self.samples[sample_id]
            sample.turns, sample.last = turns, last
            sample.outputs = list(last.get("outputs") or [])
            self._queue_next(sample)
        self.fresh = (s for s in self.samples.values() if s.turns == 0)
        self.in_flight: dict[str, tuple[Sample, list[int]]] = {}

    def next_request(self) -> tuple[str, list[int]] | None:
        """A (request id, prompt ids) to send, or None while nothing is ready."""
        if self.ready:
            sample, prompt = self.ready.popleft()
        elif (fresh := next(self.fresh, None)) is not None:
            sample, prompt = fresh, fresh.row["prompt_ids"]
        else:
            return None
        request_id = self._request_id(sample)
        self.in_flight[request_id] = (sample, prompt)
        return request_id, prompt

    def complete(self, done: Completion) -> dict:
        """The prompt columns of the raw row for `done`; queues the sample's next turn."""
        sample, prompt = self.in_flight.pop(done.sample_id)
        reasoning_open = self.roles.think is not None and prompt[-1] == self.roles.think
        sample.turns += 1
        sample.last = dict(
            prompt_ids=prompt, output_ids=done.output_ids, finish_reason=done.finish_reason
        )
        if self.settings.rendered:
            sample.outputs.append((done.output_ids, reasoning_open))
        self._queue_next(sample)
        row = sample.row
        return dict(
            sample_id=row["sample_id"],
            dataset=row["dataset"],
            turn=sample.turns,
            messages=row["messages"],
            tools=row["tools"],
            prompt_ids=prompt,
            prompt_len=len(prompt),
            reasoning_open=reasoning_open,
            regenerate=self.settings.regenerate,
        )

    def has_unsent(self) -> bool:
        """Whether a request is ready or a sample was never sent; nothing to send with nothing in
        flight means the dataset is done (a resumed run then needs no engine at all)."""
        return bool(self.ready) or any(
            s.turns == 0 and self._request_id(s) not in self.in_flight
            for s in self.samples.values()
        )

    @property
    def planned_turns(self) -> int:
        return sum(s.planned_turns for s in self.samples.values())

    @property
    def stopped_at_limit(self) -> int:
        return sum(s.stopped_at_limit for s in self.samples.values())

    def _request_id(self, sample: Sample) -> str:
        """The sample id (last_turn), or `<sample id>@turn<k>`: unique, and stable across runs,
        so a resumed run samples what the first would have."""
        sample_id = sample.row["sample_id"]
        return f"{sample_id}@turn{sample.turns + 1}" if self.settings.every_turn else sample_id

    def _queue_next(self, sample: Sample) -> None:
        last = sample.last
        if not self.settings.every_turn or sample.turns >= sample.planned_turns:
            sample.outputs = []  # the conversation is over: nothing renders from them again
            return
        if last is None:  # queued only once a turn is back or stored
            raise ValueError(f"sample {sample.row['sample_id']}: no turn to continue from")
        if last["finish_reason"] == "abort" or not last["output_ids"]:
            sample.outputs = []
            return
        if self.render is not None and self.settings.rendered:
            prompt = self.render(sample.row, sample.outputs)
        else:
            end_of_turn = self.roles.end_of_turn
            if end_of_turn is None:
                raise ValueError(
                    "regenerate: all_turns closes each turn with the end-of-turn token, and the "
                    "tokenizer has none: name it in the token roles (end_of_turn)"
                )
            prompt = next_turn_prompt(
                last["prompt_ids"],
                last["output_ids"],
                sample.row["turn_deltas"][sample.turns - 1],
                end_of_turn,
            )
        limit = self.settings.max_prompt_tokens
        if limit is not None and len(prompt) > limit:
            sample.stopped_at_limit = True
            return
        self.ready.append((sample, prompt))
