"""How long each dataset's generation will take, projected from a short timed sample of it on the
servers the run will use (`python -m stages.commands.estimate`), before committing GPUs for days.

A continuous-batching server takes one step per token of every running request, and a step takes
longer the more requests run in it. The sample's replies say when each request was in flight and
how many tokens it got, which fixes the step's seconds at every number of requests in flight
(`fit_steps`). Replaying the dataset's requests through that server (`replay_seconds`), output
lengths drawn from the sample's, gives the run's time with its fill and drain. Those matter where
a few replies run to the token limit: one such reply holds a slot for the whole of a short run.
Drawing the sample again with replacement gives the range its size allows.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

from ..engines import Sampling
from .monitor import Backlog

Span = tuple[float, float, int]  # one sampled request: sent and answered (seconds), tokens
TRIALS = 100  # redraws of the sample: the range is their 10th to 90th percentile


@dataclass(frozen=True)
class Steps:
    """A server step's seconds with `running` requests in it: `full_s` when every slot is busy, of
    which the part `share` grows in proportion to the requests (the rest is paid per step)."""

    full_s: float
    share: float
    slots: int

    def seconds(self, running: int) -> float:
        return self.full_s * (1 - self.share + self.share * running / self.slots)

    @property
    def tokens_per_s(self) -> float:
        """The pace with every slot busy."""
        return self.slots / self.full_s


def fit_steps(spans: list[Span], slots: int) -> Steps:
    """The steps that best account for every sampled request's tokens (least squares): a request
    gets one token a step, so its tokens are the steps taken while it was in flight. Of the
    shares that fit within 1% as well as the best, the least: a sample that kept the same
    requests in flight throughout cannot tell how a step grows with them."""
    times, running, at = _in_flight(spans)
    bounds = [(at[start], at[end]) for start, end, _ in spans]  # each span's times, as indices
    fits = []  # (squared error, share, tokens per full step)
    for share in (i / 100 for i in range(101)):
        full_steps = [0.0]  # full steps' worth of work done by each time
        for k, n in enumerate(running):
            shape = 1 - share + share * n / slots
            full_steps.append(full_steps[-1] + ((times[k + 1] - times[k]) / shape if n else 0.0))
        taken = [full_steps[end] - full_steps[start] for start, end in bounds]
        squares = sum(t * t for t in taken)
        if not squares:
            continue
        per_step = sum(t * tokens for t, (_, _, tokens) in zip(taken, spans)) / squares
        error = sum((tokens - per_step * t) ** 2 for t, (_, _, tokens) in zip(taken, spans))
        fits.append((error, share, per_step))
    least = min(fits, default=None)
    if least is None or least[2] <= 0:
        raise ValueError("the sample's replies took no time or gave no tokens: nothing to time")
    _, share, per_step = next(f for f in fits if f[0] <= least[0] * 1.01)
    return Steps(1 / per_step, share, slots)


def _in_flight(spans: list[Span]) -> tuple[list[float], list[int], dict[float, int]]:
    """Every time a sampled request was sent or answered, in order, how many were in flight
    from each of those times to the next, and each time's index."""
    times = sorted({t for start, end, _ in spans for t in (start, end)})
    at = {t: i for i, t in enumerate(times)}
    change = [0] * len(times)
    for start, end, _ in spans:
        change[at[start]] += 1
        change[at[end]] -= 1
    running, n = [], 0
    for delta in change[:-1]:
        n += delta
        running.append(n)
    return times, running, at


def replay_seconds(lengths: Iterable[int], steps: Steps) -> float:
    """Seconds the server of `steps` takes over requests of `lengths` tokens, sent in order, each
    as soon as a slot frees."""
    pending = iter(lengths)
    ends: list[int] = []  # the step at which each running request finishes
    now, seconds = 0, 0.0
    for length in islice(pending, steps.slots):
        heapq.heappush(ends, max(length, 1))
    while ends:
        end = ends[0]
        seconds += (end - now) * steps.seconds(len(ends))
        now = end
        while ends and ends[0] == end:
            heapq.heappop(ends)
        for length in islice(pending, steps.slots - len(ends)):
            heapq.heappush(ends, now + max(length, 1))
    return seconds


@dataclass(frozen=True)
class Projection:
    dataset: str
    samples: int  # generated in the estimate
    failed: int
    mean_prompt_tokens: float
    mean_output_tokens: float
    tokens_left: float  # projected: min(budget left, prompts left * mean output)
    requests_left: int  # the requests that generate those tokens
    tokens_per_s: float  # the fitted pace with every slot busy
    step_share: float  # the part of a full step that grows with the requests in it
    busy_s: float  # of the sample's time, how long it held every slot busy
    sample_s: float  # the sample's time, first request sent to last reply
    replayed_s: float  # the fitted server's time over the sample, the same lengths in order
    hours: float  # the median over redraws of the sample
    hours_low: float  # 10th percentile
    hours_high: float  # 90th percentile
    spans: tuple[Span, ...] = field(default=(), repr=False)  # the sample, to check it otherwise
    redraws_s: tuple[float, ...] = field(default=(), repr=False)  # the run's seconds per redraw


def run_hours(projections: list[Projection]) -> tuple[float, float, float]:
    """The whole run's hours, median and 10-90% range: the datasets' redraws are independent,
    so the i-th of each together make one redraw of the run (the sum of each dataset's 90th
    percentile would be a run in which every dataset drew its long replies at once)."""
    runs = [sum(seconds) for seconds in zip(*(p.redraws_s for p in projections if p.redraws_s))]
    return _hours_spread(runs) if len(runs) >= 2 else (0.0, 0.0, 0.0)


def _hours_spread(seconds: list[float]) -> tuple[float, float, float]:
    """Median, 10th and 90th percentiles of redraws' `seconds`, in hours."""
    deciles = statistics.quantiles(seconds, n=10)
    return statistics.median(seconds) / 3600, deciles[0] / 3600, deciles[-1] / 3600


def project_hours(
    engine,
    sampling: Sampling,
    samples: dict[str, list[tuple[str, list[int]]]],
    backlogs: dict[str, Backlog],
    clock: Callable[[], float] = time.monotonic,
    seed: int = 0,
) -> list[Projection]:
    """Generate a sample of every dataset as the run does (one dataset after another, the
    engine's `slots` requests in flight), fit the server's steps to it, and replay each dataset's
    requests through them.

    The first dataset's first `slots` prompts go once untimed before any timing: a fresh server
    compiles kernels for its first batches, which a run that lasts days pays once."""
    projections, slots, rng = [], engine.slots, random.Random(seed)
    for _ in engine.generate(next(iter(samples.values()), [])[:slots], sampling):
        pass
    for name, rows in samples.items():
        prompt_len = {sid: len(ids) for sid, ids in rows}
        start, spans, failed, prompts = clock(), [], 0, 0
        for done in engine.generate(rows, sampling):
            if done.finish_reason == "abort":
                failed += 1
                continue
            answered = clock() - start
            spans.append((max(answered - done.latency_s, 0.0), answered, len(done.output_ids)))
            prompts += prompt_len[done.sample_id]
        limit, backlog = sampling.max_new_tokens, backlogs[name]
        projections.append(project_sample(name, spans, failed, prompts, backlog, slots, limit, rng))
    return projections


def project_sample(
    name: str,
    spans: list[Span],
    failed: int,
    prompt_tokens: int,
    backlog: Backlog,
    slots: int,
    limit: int,
    rng: random.Random,
) -> Projection:
    """One dataset's projection from its sample's `spans` (`prompt_tokens` in all), `limit` the
    replies' token limit."""
    if not spans:  # every request failed: nothing to time
        return Projection(name, failed, failed, 0.0, 0.0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0)
    spans.sort()
    lengths = [tokens for _, _, tokens in spans]
    try:
        steps = fit_steps(spans, slots)
    except ValueError as e:
        raise ValueError(
            f"{name}: {e}; every sampled reply came back empty or at once: check the target's "
            f"chat template and stop tokens against a reply of the server's"
        ) from None
    trials = [
        _run_seconds(_redraw(lengths, limit, rng), backlog, steps, rng) for _ in range(TRIALS)
    ]
    mean = sum(lengths) / len(lengths)
    tokens = backlog.tokens(mean)
    return Projection(
        name,
        len(spans) + failed,
        failed,
        round(prompt_tokens / len(spans), 1),
        round(mean, 1),
        round(tokens),
        math.ceil(tokens / mean) if mean else 0,
        round(steps.tokens_per_s, 1),
        steps.share,
        round(_busy_seconds(spans, slots), 2),
        round(max(end for _, end, _ in spans) - spans[0][0], 2),
        round(replay_seconds(lengths, steps), 2),
        *_hours_spread(trials),
        tuple(spans),
        tuple(trials),
    )


def _redraw(lengths: list[int], limit: int, rng: random.Random) -> list[int]:
    """The sample drawn again. Replies that ran to the token limit are few and cost the most, so
    a sample that saw k of them in n stands for a share drawn from Beta(k + 1/2, n - k + 1/2)
    (Jeffreys'), not for k/n exactly; the other replies are drawn from the sample's others."""
    short = [n for n in lengths if n < limit]
    share = rng.betavariate(len(lengths) - len(short) + 0.5, len(short) + 0.5)
    return [rng.choice(short) if short and rng.random() >= share else limit for _ in lengths]


def _run_seconds(drawn: list[int], backlog: Backlog, steps: Steps, rng: random.Random) -> float:
    """One redraw's run: its requests replayed, lengths drawn from the redrawn sample; past
    8 x `slots` requests every slot is busy, so the rest are counted at the full pace."""
    mean = sum(drawn) / len(drawn)
    requests = math.ceil(backlog.tokens(mean) / mean) if mean else 0
    replayed = min(requests, 8 * steps.slots)
    seconds = replay_seconds(rng.choices(drawn, k=replayed), steps)
    return seconds + (requests - replayed) * mean / steps.tokens_per_s


def _busy_seconds(spans: list[Span], slots: int) -> float:
    """How long the sample had `slots` requests or more in flight."""
    times, running, _ = _in_flight(spans)
    return sum(times[k + 1] - times[k] for k, n in enumerate(running) if n >= slots)
