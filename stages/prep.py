"""prep@<dataset>: source rows -> chat messages -> the target's chat template -> prompt token ids.

Reads params `target`, `datasets.<name>.prep` and `datasets.<name>.expect.reasoning` (every
generation prompt must end as it promises, target/template.py). With `regenerate: all_turns` each
conversation also gets the ids the template adds between its turns (the template checked to
render a conversation as its turns concatenated); with `all_turns_rendered`, the source messages
before each turn, from which generate renders the later prompts. Writes
data/prompts/<name>.parquet and reports/prep/<name>.json (rows read, malformed, duplicate, too
long, kept, turns).
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .artifacts.prompts import PromptSettings, write_prompts
from .cli import PathOpt, StageError, run, summary
from .params.datasets import ExpectParams, PrepParams, read_dataset
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .reports.prep import PrepReport
from .runtime.outputs import remove_stale_temps_around
from .sources import SourceError, prompt_messages, read_conversations, turn_bounds
from .target_model.template import ChatTemplate, TemplateError, TurnPlan
from .target_model.tokens import TokenRoles
from .wiring.target import target_roles, target_tokenizer


def normalized_key(messages: list[dict], tools: list | None) -> str:
    """Prompt identity for dedupe: content with case and whitespace folded."""
    text = json.dumps([messages, tools], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()


@contextlib.contextmanager
def template_params(dataset: str, where: str = "") -> Iterator[None]:
    """A template problem as a stage error naming the params keys that would fix it."""
    try:
        yield
    except TemplateError as err:
        keys = {
            "expect_reasoning": f"datasets.{dataset}.expect.reasoning",
            "regenerate": f"datasets.{dataset}.prep.regenerate",
            "template_kwargs": "target.template_kwargs",
            "chat_template": "target.chat_template",
            "roles": "target.roles",
        }
        at = f" ({where})" if where else ""
        raise StageError(
            f"dataset {dataset}: {err}{at}; params: {', '.join(keys[s] for s in err.settings)}"
        ) from None


def turn_messages(messages: list[dict], every_turn: bool) -> list[tuple[int, int]]:
    """The (start, end) of the messages before each turn the target writes: every turn, or the
    last one alone."""
    return turn_bounds(messages) if every_turn else [(0, len(prompt_messages(messages)))]


@dataclass
class Tally:
    """What one pass over the source met, for the report: the counts, and the messages of the
    malformed rows, so that a skipped row can still be found and fixed."""

    counts: dict[str, int] = field(
        default_factory=lambda: dict(
            rows=0, malformed=0, duplicate=0, too_long=0, sampled_out=0, kept=0, turns=0
        )
    )
    malformed: list[str] = field(default_factory=list)

    def bad_row(self, err: SourceError) -> None:
        """A row skipped (skip_bad_rows) is counted, never silently lost."""
        self.counts["malformed"] += 1
        self.malformed.append(str(err))


def prompt_row(
    name: str,
    sample_id: str,
    messages: list[dict],
    segments: list[list[dict]],
    tools: list | None,
    plan: TurnPlan,
    roles: TokenRoles,
    settings: PromptSettings,
) -> dict:
    """One row of data/prompts: generate needs the messages (all_turns_rendered renders later
    prompts from them) besides the ids, and whether the prompt already opened reasoning."""
    ids = plan.prompt_ids
    return dict(
        sample_id=sample_id,
        dataset=name,
        messages=json.dumps(messages, ensure_ascii=False),
        tools=None if tools is None else json.dumps(tools, ensure_ascii=False),
        prompt_ids=ids,
        prompt_len=len(ids),
        reasoning_open=roles.think is not None and ids[-1] == roles.think,
        turn_deltas=plan.deltas,
        turn_messages=[json.dumps(s, ensure_ascii=False) for s in segments]
        if settings.rendered
        else [],
    )


def prompt_rows(
    name: str,
    prep: PrepParams,
    settings: PromptSettings,
    template: ChatTemplate,
    roles: TokenRoles,
    tally: Tally,
) -> Iterator[dict]:
    """Every usable conversation of the source as a prompt row, in file order; malformed,
    duplicate and too long ones are counted in `tally` and left out, as the report says."""
    seen: set[str] = set()
    ids_seen: set[str] = set()
    rows = read_conversations(
        prep.path,
        prep.format,
        columns=prep.columns,
        on_bad_row=tally.bad_row if prep.skip_bad_rows else None,
    )
    for conv in rows:
        tally.counts["rows"] += 1
        sample_id = f"{name}/{conv.source_id}"
        try:
            bounds = turn_messages(conv.messages, settings.every_turn)
        except ValueError as err:
            bad = SourceError(prep.path, None, f"{sample_id}: {err}")
            if not prep.skip_bad_rows:
                raise bad from None
            tally.bad_row(bad)
            continue
        messages = conv.messages[: bounds[-1][1]]
        key = normalized_key(messages, conv.tools)
        if key in seen:
            tally.counts["duplicate"] += 1
            continue
        seen.add(key)
        if sample_id in ids_seen:  # a source id reused for different content: keep both, apart
            sample_id = f"{sample_id}~{key[:8]}"
        ids_seen.add(sample_id)
        segments = [conv.messages[a:b] for a, b in bounds]
        with template_params(name, f"sample {sample_id} of {prep.path}"):
            plan = template.plan(segments, conv.tools)
        if len(plan.prompt_ids) > prep.max_prompt_tokens:
            tally.counts["too_long"] += 1
            continue
        yield prompt_row(name, sample_id, messages, segments, conv.tools, plan, roles, settings)


def sample(rows: Iterable[dict], prep: PrepParams, tally: Tally) -> list[dict]:
    """At most max_samples rows, those of lowest seeded rank, in sample id order: the pick does
    not depend on the source's order, nor the output's bytes on it."""
    keep: list[tuple[int, str, dict]] = []  # max-heap by -rank: the N lowest seeded ranks
    for row in rows:
        sample_id = row["sample_id"]
        rank = int(hashlib.sha256(f"{prep.seed}:{sample_id}".encode()).hexdigest()[:15], 16)
        heapq.heappush(keep, (-rank, sample_id, row))
        if prep.max_samples is not None and len(keep) > prep.max_samples:
            heapq.heappop(keep)
            tally.counts["sampled_out"] += 1
    return sorted((row for _, _, row in keep), key=lambda r: r["sample_id"])


def prepare(
    name: str,
    prep: PrepParams,
    expect: ExpectParams,
    target: TargetParams,
    out: Path,
    report: Path,
) -> dict:
    """Build, pick and write one dataset's prompts and its report; the counts, for the summary."""
    tokenizer = target_tokenizer(target)
    roles = target_roles(target, tokenizer)
    settings = PromptSettings(prep.regenerate, prep.max_prompt_tokens)
    with template_params(name):
        template = ChatTemplate(
            tokenizer,
            roles,
            target.template_kwargs,
            target.chat_template or f"the chat template of {target.path}",
            expect.reasoning,
            prep.regenerate,
        )
    tally = Tally()
    selected = sample(prompt_rows(name, prep, settings, template, roles, tally), prep, tally)
    counts = tally.counts
    if not selected:
        raise StageError(
            f"{prep.path}: no usable prompt for dataset {name!r} "
            f"({counts}); check datasets.{name}.prep (format, path, max_prompt_tokens)"
        )
    counts["kept"] = len(selected)
    counts["turns"] = sum(
        max(1 + len(row["turn_deltas"]), len(row["turn_messages"])) for row in selected
    )
    write_prompts(selected, out, settings)
    PrepReport(dataset=name, **counts, malformed_examples=tally.malformed[:5]).write(report)
    return counts


def main(dataset: str, out: PathOpt, report: PathOpt, params: Path = PARAMS_FILE) -> None:
    """Build the prompt ids of one dataset."""
    ds = read_dataset(dataset, params)
    target = TargetParams.read(params)
    remove_stale_temps_around(out, report)
    counts = prepare(dataset, ds.prep, ds.expect, target, out, report)
    print(summary(f"prep {dataset}", counts))


if __name__ == "__main__":
    run(main)
