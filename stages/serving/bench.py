"""Measure a drafter on SGLang: the same prompts sent to the target served with it (EAGLE3 or
DFLASH) and to the same target served without speculation.

Acceptance length comes from each reply's meta_info: tau = sum(completion_tokens) /
sum(spec_verify_ct), SGLang's own spec_accept_length pooled over requests. SGLang's
completion_tokens count the first token, which the target's prefill produces before any draft
exists, so this tau is higher by requests / verify steps than the in-process tau of
stages.drafter.speculate, which leaves that token out: `tau_excluding_prefill` is the number to
compare with it. Throughput is output tokens per wall-clock second of each server at the same
concurrency, the two servers measured one after the other so they never share the GPUs.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import httpx

from ..engines import Sampling
from ..engines.sglang_http import INFO_PATHS, Reply, SGLangEngine, SGLangError, get_json
from ..reports.benchmark import ServedFigures, ServedTemperature
from ..runtime.progress import Progress
from .launch import Speculation

SPECULATIVE_FIELDS = (
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)


def server_facts(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> dict:
    """Version, model and speculative settings from /server_info (or /model_info for the version);
    keys the server does not report are absent (SGLang's /server_info also holds its --api-key:
    only these keys are kept). A server that refuses `api_key` (or its absence) raises AuthError.
    """
    info: dict = {}
    for path in (*INFO_PATHS, "/model_info"):
        try:
            answer = get_json(f"{url}{path}", api_key, timeout_s)
        except httpx.HTTPError:
            continue
        if isinstance(answer, dict):
            info = {**answer, **info}
            if "version" in info:
                break
    return {key: info[key] for key in ("version", "model_path", *SPECULATIVE_FIELDS) if key in info}


def check_speculative_server(facts: dict, url: str, spec: Speculation) -> None:
    """Refuse a server that reports speculative settings other than `spec`'s."""
    if "speculative_algorithm" not in facts:
        return  # the server does not say: its replies will tell
    algorithm = facts["speculative_algorithm"]
    wrong = {k: facts[k] for k, v in spec.settings().items() if facts.get(k, v) != v}
    flags = " ".join(Speculation(spec.algorithm, "DRAFTER", spec.tokens_per_step).args())
    if not algorithm:
        raise SGLangError(
            f"{url} is not running speculative decoding (its /server_info has "
            f"speculative_algorithm {algorithm!r}); serve the target with {flags}"
        )
    if wrong:
        raise SGLangError(
            f"{url} serves {wrong}, where this benchmark measures {flags} (EAGLE instead of "
            f"EAGLE3 gives tau about 1; another width gives another tau); relaunch it "
            f"or set the benchmark's width to the server's"
        )


def check_plain_server(facts: dict, url: str) -> None:
    if facts.get("speculative_algorithm"):
        raise SGLangError(
            f"{url} runs speculative decoding ({facts['speculative_algorithm']}), "
            f"so it is no baseline: serve the same target without --speculative-* "
            f"flags"
        )


@dataclass(frozen=True)
class ServerRun:
    """A server's replies to a set of requests and the wall-clock seconds they took."""

    url: str
    replies: list[Reply]
    wall_s: float

    @property
    def completion_tokens(self) -> int:
        return sum(r.meta_info["completion_tokens"] for r in self.replies)

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def outputs(self) -> dict[str, list[int]]:
        return {r.completion.sample_id: r.completion.output_ids for r in self.replies}

    @staticmethod
    def pooled(runs: list[ServerRun]) -> ServerRun:
        """Runs made one after the other, as one."""
        return ServerRun(
            ", ".join(dict.fromkeys(r.url for r in runs)),
            [reply for r in runs for reply in r.replies],
            sum(r.wall_s for r in runs),
        )


def measure(
    engine: SGLangEngine,
    requests: list[tuple[str, list[int]]],
    sampling: Sampling,
    progress: Progress | None = None,
) -> ServerRun:
    """Send every request, `engine.concurrency` in flight, each reply counted in `progress`; a
    reply the measurement cannot count (aborted, or without completion_tokens) is an error, since
    holes would flatter the server."""
    url = ", ".join(engine.urls)
    start = time.monotonic()
    replies = []
    for reply in engine.replies(requests, sampling):
        replies.append(reply)
        if progress:
            progress.update(1, len(reply.completion.output_ids))
    wall_s = time.monotonic() - start
    for reply in replies:
        done = reply.completion
        if done.finish_reason == "abort":
            raise SGLangError(
                f"{url}: sample {done.sample_id} was aborted ({done.error}); every "
                f"request must finish to be measured (a prompt over the context "
                f"needs a smaller max_new_tokens or a larger --context-length)"
            )
        if not isinstance(reply.meta_info.get("completion_tokens"), int):
            raise SGLangError(
                f"{url}/generate: the reply to sample {done.sample_id} has no "
                f"meta_info.completion_tokens; meta_info keys: "
                f"{sorted(reply.meta_info)}"
            )
    return ServerRun(url, replies, wall_s)


@dataclass(frozen=True)
class Acceptance:
    """Verify-step counts of a speculative server's replies, pooled."""

    requests: int
    completion_tokens: int  # the prefill's token included, as SGLang counts
    verify_steps: int
    histogram: list[int] | None  # verify steps that accepted k drafts, k = 0, 1, ...; None
    # when a reply came without spec_correct_drafts_histogram

    @property
    def tau(self) -> float:
        return _ratio(self.completion_tokens, self.verify_steps)

    @property
    def tau_excluding_prefill(self) -> float:
        """Generated tokens per verify step without the prefill's token: the in-process tau."""
        return _ratio(self.completion_tokens - self.requests, self.verify_steps)

    def per_position(self, num_steps: int) -> tuple[list[float], list[float]] | None:
        """(conditional, unconditional) acceptance of drafts 1..num_steps, from the histogram."""
        if self.histogram is None:
            return None
        counts = self.histogram + [0] * (num_steps + 1 - len(self.histogram))
        reached = [sum(counts[j:]) for j in range(num_steps + 1)]
        return (
            [_ratio(reached[j], reached[j - 1]) for j in range(1, num_steps + 1)],
            [_ratio(reached[j], reached[0]) for j in range(1, num_steps + 1)],
        )


def acceptance(run: ServerRun) -> Acceptance:
    """Pool spec_verify_ct over a speculative server's replies. A reply without it is an error
    unless the request never reached a verify step (one token, from the prefill), where recent
    SGLang leaves the count out."""
    verify, histograms = 0, []
    for reply in run.replies:
        meta = reply.meta_info
        if "spec_verify_ct" not in meta:
            if meta["completion_tokens"] > 1:
                raise SGLangError(
                    f"{run.url} is not running speculative decoding: its reply to sample "
                    f"{reply.completion.sample_id} ({meta['completion_tokens']} tokens) has no "
                    f"meta_info.spec_verify_ct. Serve the target with --speculative-algorithm "
                    f"EAGLE3 (or DFLASH) --speculative-draft-model-path DRAFTER "
                    f"--speculative-num-draft-tokens N (tokens verified per step)"
                )
            continue
        verify += meta["spec_verify_ct"]
        histograms.append(meta.get("spec_correct_drafts_histogram"))
    lists = [h for h in histograms if isinstance(h, list)]
    histogram = None
    if histograms and len(lists) == len(histograms):
        histogram = [sum(c) for c in itertools.zip_longest(*lists, fillvalue=0)]
    return Acceptance(len(run.replies), run.completion_tokens, verify, histogram)


def check_no_speculation(run: ServerRun) -> None:
    """The baseline must decode token by token: a reply with spec_verify_ct says it does not."""
    for reply in run.replies:
        if "spec_verify_ct" in reply.meta_info:
            raise SGLangError(
                f"{run.url} answered sample {reply.completion.sample_id} with "
                f"meta_info.spec_verify_ct: it runs speculative decoding, so it is "
                f"no baseline; serve the same target without --speculative-* flags"
            )


def compare(spec: ServerRun, base: ServerRun, num_steps: int) -> dict:
    """The figures of one prompt set: tau from the speculative server, each server's output
    tokens/s and the speedup, and how many outputs the two servers agree on."""
    acc = acceptance(spec)
    check_no_speculation(base)
    positions = acc.per_position(num_steps)
    base_outputs = base.outputs
    return {
        "prompts": acc.requests,
        "tau": _round(acc.tau),
        "tau_excluding_prefill": _round(acc.tau_excluding_prefill),
        "conditional": positions and [_round(x) for x in positions[0]],
        "unconditional": positions and [_round(x) for x in positions[1]],
        "verify_steps": acc.verify_steps,
        "completion_tokens": acc.completion_tokens,
        "spec_tokens_per_s": _round(spec.tokens_per_s, 2),
        "base_tokens_per_s": _round(base.tokens_per_s, 2),
        "speedup": _round(_ratio(spec.tokens_per_s, base.tokens_per_s), 3),
        "spec_mean_latency_s": _round(_mean_latency(spec)),
        "base_mean_latency_s": _round(_mean_latency(base)),
        "outputs_equal_baseline": sum(
            base_outputs.get(sid) == ids for sid, ids in spec.outputs.items()
        ),
    }


def _mean_latency(run: ServerRun) -> float:
    """Mean e2e_latency of the replies (the client's own clock where the server sent none)."""
    return _ratio(sum(r.completion.latency_s for r in run.replies), len(run.replies))


def _ratio(num: float, den: float) -> float:
    return num / den if den else float("nan")


def _round(x: float, digits: int = 4) -> float | None:
    """Rounded for the report; NaN (nothing to divide by) becomes null, which JSON can hold."""
    return None if x != x else round(x, digits)


@dataclass(frozen=True)
class ServedClient:
    """How the benchmark's client talks to each server: requests in flight, the longest wait for
    a reply, retries, the API key (None: none)."""

    concurrency: int
    timeout_s: float
    max_retries: int
    api_key: str | None


def measure_server(
    role: str,
    url: str,
    client: ServedClient,
    spec: Speculation,
    requests: dict[str, list[tuple[str, list[int]]]],
    samplings: dict[float, Sampling],
) -> tuple[dict[tuple[float, str], ServerRun], dict]:
    """The server at `url` checked to be what its role (spec: serving `spec`, or base) needs,
    then its runs per (temperature, prompt set), and its facts (version, model, speculative
    settings, retries)."""
    facts = server_facts(url, api_key=client.api_key)
    if role == "spec":
        check_speculative_server(facts, url, spec)
    else:
        check_plain_server(facts, url)
    engine = SGLangEngine(
        [url],
        client.concurrency,
        client.timeout_s,
        max_retries=client.max_retries,
        api_key=client.api_key,
    )
    progress = Progress(f"benchmark {role}", len(samplings) * sum(map(len, requests.values())))
    runs = {
        (t, name): measure(engine, group, sampling, progress)
        for t, sampling in samplings.items()
        for name, group in requests.items()
    }
    return runs, {**facts, "retries": engine.retries}


def compare_servers(
    runs: dict[str, dict[tuple[float, str], ServerRun]],
    temperatures: list[float],
    names: list[str],
    drafts: int,
) -> dict[float, ServedTemperature]:
    """Per temperature, the speculative server against the base one: over all prompt sets
    pooled, and per set; acceptance per draft position, `drafts` of them."""
    compared = {}
    for t in temperatures:
        spec, base = (
            ServerRun.pooled([runs[role][t, name] for name in names]) for role in ("spec", "base")
        )
        compared[t] = ServedTemperature(
            **compare(spec, base, drafts),
            datasets={
                name: ServedFigures(**compare(runs["spec"][t, name], runs["base"][t, name], drafts))
                for name in names
            },
        )
    return compared
