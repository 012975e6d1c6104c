"""What the EAGLE-3 and DFlash benchmark stages share: the held-out prompts, speculative decoding
in process against plain decoding of the same target, and the served measurement against a
server without speculation, from params `benchmark` and `target`.

A stage brings its drafter as a `Family`: how SGLang serves it (the launch flags, the width),
how to speculate with it in process, and the records its report is written as. Both families
measure the same prompts at the same temperatures through the same loop and counts, so their
taus compare; each family is its own DVC stage, so a change to one reruns only its own.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from transformers import AutoConfig

from ..artifacts.merged import iter_rows, split_path
from ..cli import StageError, params_key
from ..drafter.speculate import CachedTarget, SpecResult, acceptance_stats, choose
from ..engines import AuthError, Sampling
from ..params.benchmark import BenchmarkParams, BenchmarkSGLangParams, BenchmarkSource
from ..params.server import SGLangLaunchParams
from ..params.target import TargetParams
from ..reports.benchmark import (
    GREEDY,
    BenchmarkReport,
    Drafter,
    Drafting,
    InProcessBenchmark,
    InProcessFigures,
    InProcessTemperature,
    Records,
    ServedBenchmark,
    ServedTemperature,
    greedy_tau,
)
from ..runtime.files import write_csv
from ..runtime.outputs import remove_stale_temps_around
from ..runtime.progress import Progress
from ..serving.bench import ServedClient, ServerRun, compare_servers, measure_server
from ..serving.launch import Speculation, is_healthy
from ..sources import SourceError, prompt_messages, read_conversations
from ..target_model.model import load_causal_lm
from ..target_model.tokenizer import render_prompt
from .engines import server_command, start_launched
from .target import api_key, target_roles, target_tokenizer

if TYPE_CHECKING:  # the class imports transformers' model loading, slow for a type hint
    from transformers import PreTrainedModel

# One prompt decoded speculatively: (prompt, max_new_tokens, temperature, stop ids, generator).
Speculate = Callable[[list[int], int, float, list[int], torch.Generator], SpecResult]


@dataclass(frozen=True)
class Family:
    """A drafter family as the benchmark measures it."""

    drafter: Drafter
    mode: Drafting
    speculation: Speculation  # how SGLang serves the drafter, and at what width
    load: Callable[[PreTrainedModel], Speculate]  # the drafter loaded beside this target
    records: Records  # what the report is written as (hf, sglang)
    url_key: Literal["spec_url", "dflash_url"]  # the benchmark.sglang key of its running server

    def facts(self) -> dict:
        """The fields both records open with."""
        s = self.speculation
        return dict(
            drafter=self.drafter,
            num_steps=s.drafts,
            tokens_verified_per_step=s.tokens_per_step,
            topk=1,
            mode=self.mode,
        )


def eval_prompts(eval_file: Path, limit: int) -> dict[str, list[list[int]]]:
    prompts: dict[str, list[list[int]]] = {}
    for row in iter_rows(eval_file, ["dataset", "input_ids", "loss_spans"]):
        group = prompts.setdefault(row["dataset"], [])
        if len(group) < limit:  # the first turn's prompt
            group.append(row["input_ids"][: row["loss_spans"][0][0]])
    return prompts


def file_prompts(
    source: BenchmarkSource, tokenizer, template_kwargs: dict, limit: int
) -> list[list[int]]:
    out = []
    for conv in read_conversations(source.path, source.format, columns=source.columns):
        out.append(
            render_prompt(tokenizer, prompt_messages(conv.messages), conv.tools, template_kwargs)
        )
        if len(out) >= limit:
            break
    return out


@torch.no_grad()
def plain_decode(
    target,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float,
    stop_ids: set[int],
    generator: torch.Generator,
) -> list[int]:
    """One target forward per token over the same KV cache as the speculation: the baseline."""
    device = next(target.parameters()).device
    ids, cached = torch.tensor(prompt, device=device), CachedTarget(target)
    out: list[int] = []
    while len(out) < max_new_tokens:
        token = choose(cached.forward(ids)[0][-1], temperature, generator)[0]
        out.append(token)
        ids = torch.cat([ids, ids.new_tensor([token])])
        if token in stop_ids:
            break
    return out


@dataclass
class PairedDecodes:
    """One prompt set decoded with the drafter and without at one temperature: acceptance comes
    from the speculative results, the wall-clock speedup from the two sums of seconds."""

    results: list[SpecResult] = field(default_factory=list)
    spec_s: float = 0.0
    base_s: float = 0.0
    identical: int = 0  # prompts whose plain output equals the speculative one

    @classmethod
    def pooled(cls, parts: list[PairedDecodes]) -> PairedDecodes:
        """Every prompt set's decodes as one: the figures of all of them."""
        return cls(
            [r for p in parts for r in p.results],
            sum(p.spec_s for p in parts),
            sum(p.base_s for p in parts),
            sum(p.identical for p in parts),
        )

    def figures(self) -> InProcessFigures:
        """The prompt set's entry in the report; plain decoding's tau (1: a token per target
        forward) stands beside the drafter's to compare against."""
        stats = acceptance_stats(self.results)
        return InProcessFigures(
            prompts=len(self.results),
            tau=round(stats.tau, 4),
            conditional=[round(x, 4) for x in stats.conditional],
            unconditional=[round(x, 4) for x in stats.unconditional],
            verify_steps=stats.verify_steps,
            outputs_equal_baseline=self.identical,
            tokens=stats.tokens,
            baseline_tau=1.0,
            wall_speedup=round(self.base_s / self.spec_s, 3),
        )


def decode_paired(
    target,
    speculate: Speculate,
    group: list[list[int]],
    b: BenchmarkParams,
    temperature: float,
    stop_ids: list[int],
    progress: Progress,
) -> PairedDecodes:
    """Each prompt decoded with the drafter, then plainly from the same seed, so the two outputs
    can be compared and the two wall times set against each other."""
    paired = PairedDecodes()
    for i, prompt in enumerate(group):
        t0 = time.perf_counter()
        r = speculate(
            prompt,
            b.max_new_tokens,
            temperature,
            stop_ids,
            torch.Generator().manual_seed(b.seed + i),
        )
        t1 = time.perf_counter()
        base = plain_decode(
            target,
            prompt,
            b.max_new_tokens,
            temperature,
            set(stop_ids),
            torch.Generator().manual_seed(b.seed + i),
        )
        t2 = time.perf_counter()
        paired.spec_s, paired.base_s = paired.spec_s + t1 - t0, paired.base_s + t2 - t1
        paired.identical += base == r.output_ids
        paired.results.append(r)
        progress.update(1, len(r.output_ids) + len(base))
    return paired


def benchmark(
    target,
    speculate: Speculate,
    prompts: dict[str, list[list[int]]],
    b: BenchmarkParams,
    stop_ids: list[int],
) -> dict[float, InProcessTemperature]:
    """Every prompt set at every temperature, with the drafter and without: the hf report's
    figures per temperature, every set's pooled beside each set's own."""
    total = len(b.temperatures) * sum(len(g) for g in prompts.values())
    progress = Progress("benchmark", total)  # each prompt decoded twice: with the drafter, without
    temperatures = {}
    for temperature in b.temperatures:
        per = {
            name: decode_paired(target, speculate, group, b, temperature, stop_ids, progress)
            for name, group in prompts.items()
        }
        pooled = PairedDecodes.pooled(list(per.values())).figures()
        temperatures[temperature] = InProcessTemperature(
            **vars(pooled), datasets={name: paired.figures() for name, paired in per.items()}
        )
    return temperatures


def in_process_benchmark(
    prompts: dict[str, list[list[int]]],
    b: BenchmarkParams,
    stop_ids: list[int],
    target: TargetParams,
    family: Family,
) -> InProcessBenchmark:
    """The target and the exported drafter loaded here, decoding one prompt at a time."""
    with params_key("target"):
        model = load_causal_lm(
            target.path, target.device, target.dtype, target.trust_remote_code, target.cpu_threads
        )
    temperatures = benchmark(model, family.load(model), prompts, b, stop_ids)
    return family.records[0](
        **family.facts(),
        engine="in-process transformers (KV cache)",
        temperatures=temperatures,
        tau_greedy=greedy_tau(temperatures),
        sglang_launch=family.speculation.launch_line(target.path),
    )


TAU_CONVENTION = (
    "tau = completion_tokens / spec_verify_ct as SGLang counts it: the first token, "
    "produced by the prefill before any draft, is included; tau_excluding_prefill "
    "leaves it out, as the hf mode's tau does"
)


def launch_commands(
    launch: SGLangLaunchParams, target: TargetParams, spec: Speculation
) -> dict[str, list[str]]:
    """The two servers: the same target and flags, the speculative one with the drafter."""
    if any(arg.startswith("--speculative") for arg in launch.extra_args):
        raise StageError(
            "benchmark.sglang.launch.extra_args: drop the --speculative-* flags; the "
            "benchmark adds them to the speculative server only"
        )
    base = server_command(launch, target)
    return {"spec": base + spec.args(), "base": base}


@contextlib.contextmanager
def serving(
    launch: SGLangLaunchParams | None, command: list[str], url: str | None
) -> Iterator[str]:
    """The url of a running server: the one given, or one started now and stopped after."""
    if launch is None:
        if url is None:
            raise StageError("benchmark.sglang: give the server's url, or launch it from params")
        yield url.rstrip("/")
        return
    server = start_launched(launch, command, "benchmark.sglang.launch")
    try:
        yield server.url
    finally:
        server.stop()


def check_server_params(s: BenchmarkSGLangParams, url_key: str) -> None:
    """The servers named one way only, and given ones answering, before any is used: a wrong
    params fails in seconds, naming the key to fix. `url_key`: the speculative server's key."""
    spec_url = getattr(s, url_key)
    if s.launch is not None and (spec_url or s.base_url):
        raise StageError(
            f"benchmark.sglang: give either launch or {url_key} and base_url, not both"
        )
    if s.launch is None:
        if not (spec_url and s.base_url):
            raise StageError(
                f"benchmark.sglang: mode sglang needs {url_key} and base_url (the target "
                "served with the drafter and without) or launch (start both from params)"
            )
        for key, given in ((url_key, spec_url), ("base_url", s.base_url)):
            if not is_healthy(given.rstrip("/")):
                raise StageError(
                    f"benchmark.sglang.{key}: {given}/health does not answer 200; "
                    f"start that server, or let benchmark.sglang.launch start it"
                )


def sampling_per_temperature(b: BenchmarkParams, stop_ids: list[int]) -> dict[float, Sampling]:
    """Every sampling value per temperature, sent alike to both servers so that only the
    drafter differs between them."""
    return {
        t: Sampling(
            max_new_tokens=b.max_new_tokens,
            temperature=t,
            top_p=1.0,
            top_k=-1,
            seed=b.seed,
            stop_ids=tuple(stop_ids),
        )
        for t in b.temperatures
    }


def measure_role(
    role: str,
    url: str | None,
    command: list[str],
    launch: SGLangLaunchParams | None,
    client: ServedClient,
    spec: Speculation,
    requests: dict[str, list[tuple[str, list[int]]]],
    samplings: dict[float, Sampling],
) -> tuple[dict[tuple[float, str], ServerRun], dict]:
    """One server, attached or launched from params (and stopped after), measured."""
    with serving(launch, command, url) as url:
        runs, facts = measure_server(role, url, client, spec, requests, samplings)
    return runs, {
        "url": url,
        "launched": launch is not None,
        "command": shlex.join(command),
        **facts,
    }


def served_benchmark(
    prompts: dict[str, list[list[int]]],
    b: BenchmarkParams,
    stop_ids: list[int],
    target: TargetParams,
    family: Family,
) -> ServedBenchmark:
    """Every prompt set at every temperature on the speculative server, then on the base one
    (never both at once, so a launched pair does not share the GPUs)."""
    s, spec = b.sglang, family.speculation
    key = api_key(s.api_key_env, "benchmark.sglang.api_key_env")
    check_server_params(s, family.url_key)
    client = ServedClient(s.concurrency, s.timeout_s, s.max_retries, key)
    commands = launch_commands(s.launch or SGLangLaunchParams(), target, spec)
    requests = {
        name: [(f"{name}/{i}", ids) for i, ids in enumerate(group)]
        for name, group in prompts.items()
        if group
    }
    samplings = sampling_per_temperature(b, stop_ids)
    runs: dict[str, dict[tuple[float, str], ServerRun]] = {}
    servers: dict[str, dict] = {}
    for role, url in (("spec", getattr(s, family.url_key)), ("base", s.base_url)):
        runs[role], servers[role] = measure_role(
            role, url, commands[role], s.launch, client, spec, requests, samplings
        )
    temperatures = compare_servers(runs, list(samplings), list(requests), spec.drafts)
    return family.records[1](
        **family.facts(),
        engine="sglang",
        engine_version=servers["spec"].get("version"),
        concurrency=s.concurrency,
        tau_convention=TAU_CONVENTION,
        servers=servers,
        temperatures=temperatures,
        tau_greedy=greedy_tau(temperatures),
    )


def held_out_prompts(
    merged: Path, b: BenchmarkParams, tokenizer, template_kwargs: dict
) -> dict[str, list[list[int]]]:
    """The eval split's prompts and each benchmark file's, refused where a file or the whole set
    holds none: a tau over no prompt would mean nothing."""
    eval_file = split_path(merged, "eval")
    prompts = eval_prompts(eval_file, b.max_prompts)
    for name, source in b.datasets.items():
        try:
            prompts[name] = file_prompts(source, tokenizer, template_kwargs, b.max_prompts)
        except SourceError as err:
            raise StageError(
                f"benchmark.datasets.{name}: {err} (format {source.format!r}; a file of another "
                f"format, or a wrong benchmark.datasets.{name}.format)"
            ) from None
        if not prompts[name]:
            raise StageError(
                f"benchmark.datasets.{name}: {source.path} holds no prompt (format "
                f"{source.format!r})"
            )
    if not any(prompts.values()):
        raise StageError(
            f"{eval_file}: no held-out prompts; raise merge.eval_fraction or add benchmark.datasets"
        )
    return prompts


# the acceptance plot's columns, as acceptance_rows writes them
ACCEPTANCE_COLUMNS = ["temperature", "dataset", "position", "conditional", "unconditional"]


def acceptance_rows(results: BenchmarkReport) -> list[dict]:
    """The plots CSV: one row per temperature, dataset and draft position, for DVC's plots."""
    return [
        {
            "temperature": t,
            "dataset": d,
            "position": j + 1,
            "conditional": v.conditional[j],
            "unconditional": v.unconditional[j],
        }
        for t, tv in results.temperatures.items()
        for d, v in tv.datasets.items()
        if v.conditional and v.unconditional
        for j in range(results.num_steps)
    ]


def measure_drafter(
    merged: Path,
    report: Path,
    plot: Path,
    params: Path,
    family_of: Callable[[AutoConfig], Family],
) -> None:
    """A benchmark stage's run: its family (`family_of` the target's config checks the export
    first: it names every fault before anything loads it) on the held-out prompts, in process
    or served as benchmark.mode says; the report and the per-position plot written."""
    b = BenchmarkParams.read(params)
    target = TargetParams.read(params)
    remove_stale_temps_around(report, plot)  # a killed run's half-written report
    with params_key("target"):
        target_config = AutoConfig.from_pretrained(
            target.path, local_files_only=True, trust_remote_code=target.trust_remote_code
        )
    family = family_of(target_config)
    tokenizer = target_tokenizer(target)
    stop_ids = target_roles(target, tokenizer).stop_ids
    prompts = held_out_prompts(merged, b, tokenizer, target.template_kwargs)
    results: BenchmarkReport
    if b.mode == "sglang":
        try:
            results = served_benchmark(prompts, b, stop_ids, target, family)
        except AuthError as err:
            raise StageError(f"benchmark.sglang.api_key_env: {err}") from None
    else:
        results = in_process_benchmark(prompts, b, stop_ids, target, family)
    results.write(report)
    write_csv(acceptance_rows(results), plot, ACCEPTANCE_COLUMNS)
    greedy = results.temperatures.get(GREEDY)
    per_set = greedy.datasets.items() if greedy else ()
    print(
        f"[{results.STAGE}] {family.drafter}, {results.engine}: tau at T={GREEDY:g}: "
        f"{results.tau_greedy}  "
        + "  ".join(f"{d}: {v.tau}" for d, v in per_set)
        + (f"  speedup {greedy.speedup}" if isinstance(greedy, ServedTemperature) else "")
    )
