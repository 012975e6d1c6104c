"""Typed, validated view of params.yaml.

Each stage reads only its own section. A wrong key or type fails before any work starts, with the
dotted key path and what is expected, so a typo in params.yaml never silently falls back to a
default.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

PARAMS_FILE = Path("params.yaml")
DEVICE = r"auto|cpu|cuda|cuda:\d+"  # what torch.device takes here (stages/runtime/device.py)


class ParamsError(ValueError):
    """A params.yaml key is unknown, missing or of the wrong type."""


# `api_key_env` names an environment variable, upper case as environment variables are by
# convention: a key pasted there (mixed case, dashes, dots) is refused without being echoed.
ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
SECRET_NAME_KEYS = frozenset({"api_key_env"})  # their values are never repeated in an error


def check_env_name(value: str | None, key: str) -> None:
    if value is not None and not ENV_NAME.match(value):
        raise ParamsError(
            f"{key}: must be the NAME of the environment variable that holds the server's API "
            f"key (upper-case letters, digits and _, e.g. SGLANG_API_KEY), never the key "
            f"itself; the value given is not such a name (not shown: it may be a key). Put the "
            f"key in the environment (`export SGLANG_API_KEY=...`) and its name here"
        )


# A dataset's name names its files (data/prompts/<name>.parquet, data/raw/<name>/) and stages
# (prep@<name>): letters, digits, _, - and ., not starting with a dot.
DATASET_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def param(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Any = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    pattern: str | None = None,
) -> Any:
    """One params.yaml key: its default, what it does (docs/params.md is generated from this
    text by tools/params_doc.py), the range a number must lie in and the pattern a string must
    match (checked with its type, by the check stage as by the stage that reads it)."""
    bounds = {"ge": ge, "gt": gt, "le": le, "lt": lt, "pattern": pattern}
    metadata = {"help": help, **{k: v for k, v in bounds.items() if v is not None}}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


class Ranged:
    """Checks the ranges of its param() keys when built directly in code too (build() checks them
    first, with the key's whole dotted path); KEY names the section in such errors."""

    KEY: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        prefix = self.KEY or type(self).__name__
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            _check_range(getattr(self, f.name), f, f"{prefix}.{f.name}")


@dataclass(frozen=True)
class TargetParams(Ranged):
    """The model whose outputs the drafter learns."""

    KEY = "target"

    path: str = param(help="Local Hugging Face directory of the target (weights and tokenizer).")
    chat_template: str | None = param(
        None, "A Jinja chat-template file, for models that ship none (null: the model's own)."
    )
    template_kwargs: dict = param(
        help="Passed to apply_chat_template, e.g. {thinking: true}.", factory=dict
    )
    roles: dict = param(
        help="Token-role overrides (role -> token string, e.g. {end_of_turn: '<|im_end|>'}); "
        "the rest is learned from the tokenizer.",
        factory=dict,
    )
    trust_remote_code: bool = param(False, "Run the model's own code from its directory.")
    device: str = param("auto", "auto | cpu | cuda | cuda:N.", pattern=DEVICE)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = param(
        "auto", "auto (bf16 on a GPU, fp32 on the CPU) | float32 | bfloat16 | float16."
    )
    cpu_threads: int | None = param(None, "torch threads on the CPU (null: torch's default).", ge=1)


@dataclass(frozen=True)
class PrepParams(Ranged):
    """Where a dataset's prompts come from and how they are cut."""

    format: str = param(help="The source adapter: the dataset's format (see stages/sources).")
    path: str = param(help="The file (or folder) of the dataset.")
    columns: dict | None = param(None, "Column overrides of the adapter (null: its defaults).")
    max_samples: int | None = param(None, "At most this many prompts (null: all).", ge=1)
    max_prompt_tokens: int = param(
        2048, "Longest prompt kept, in tokens (all_turns: of every turn's prompt).", ge=1
    )
    skip_bad_rows: bool = param(False, "Skip malformed rows (counted) instead of failing.")
    seed: int = param(0, "Seed of the sample order.")
    regenerate: Literal["last_turn", "all_turns", "all_turns_rendered"] = param(
        "last_turn",
        "last_turn: the target writes the reply to the last user turn or tool result; "
        "all_turns: every assistant turn in order, each on the target's own earlier turns, a "
        "later prompt the earlier ids concatenated (one training sequence per conversation; "
        "refused for templates that render history differently); all_turns_rendered: the same "
        "turns, a later prompt rendered by the chat template from the conversation so far (one "
        "training sequence per turn).",
    )


@dataclass(frozen=True)
class DatasetGenerateParams(Ranged):
    """How much of a dataset to generate."""

    budget_tokens: int = param(
        10_000_000, "Stop generating this dataset once its outputs hold this many tokens.", ge=1
    )


@dataclass(frozen=True)
class ExpectParams(Ranged):
    """What the quality gate demands of a dataset's outputs."""

    reasoning: bool = param(
        True,
        "true: every generation prompt opens reasoning or leaves it to the target; false: none "
        "opens it (prep fails otherwise), and the gate checks reasoning closes.",
    )
    tool_calls: bool = param(False, "The gate demands tool calls in this dataset's outputs.")


@dataclass(frozen=True)
class DatasetParams(Ranged):
    """One entry of `datasets`: a prep@<name> and a generate@<name> stage."""

    prep: PrepParams = param(help="Where the prompts come from.")
    generate: DatasetGenerateParams = param(
        help="This dataset's generation budget.", factory=DatasetGenerateParams
    )
    expect: ExpectParams = param(help="What the quality gate demands.", factory=ExpectParams)


@dataclass(frozen=True)
class SGLangServerArgs(Ranged):
    """Flags of `python -m sglang.launch_server`, named as SGLang names them (null: its default);
    each set key becomes `--key-name value`, `true` a bare flag."""

    host: str = param("127.0.0.1", "The address the server binds.")
    port: int = param(30000, "Its port.", ge=1, le=65535)
    tp_size: int = param(1, "Tensor-parallel GPUs per server.", ge=1)
    dp_size: int = param(1, "Data-parallel replicas inside the server.", ge=1)
    mem_fraction_static: float | None = param(
        None, "GPU memory share for weights and the KV cache.", gt=0, le=1
    )
    context_length: int | None = param(None, "The longest prompt + reply.", ge=1)
    max_running_requests: int | None = param(None, "Requests decoded at once.", ge=1)
    kv_cache_dtype: str = param("auto", "auto | bf16 | fp8_e4m3 | ...")
    enable_hierarchical_cache: bool = param(False, "Spill the KV cache to host memory.")
    hicache_size: int | None = param(
        None, "GB of host memory per rank for the hierarchical cache.", ge=1
    )
    enable_metrics: bool = param(True, "Serve /metrics (the generate stage's monitor reads it).")
    skip_tokenizer_init: bool = param(False, "No tokenizer in the server (ids only).")


@dataclass(frozen=True)
class SGLangLaunchParams(Ranged):
    """Start one server for the stage and stop it when the stage ends."""

    model_path: str | None = param(None, "What the server serves (null: target.path).")
    module: str = param(
        "sglang.launch_server",
        "The server's module (tests put their stand-in, tests.doubles.hf_server, here).",
    )
    server_args: SGLangServerArgs = param(help="The server's flags.", factory=SGLangServerArgs)
    extra_args: list[str] = param(
        help="Any other launch_server flags, e.g. [--chunked-prefill-size, '8192'].", factory=list
    )
    health_timeout_s: float = param(1800.0, "Longest wait for /health after the start.", gt=0)
    log_file: str | None = param(None, "The server's log (null: a temporary file, printed).")


@dataclass(frozen=True)
class SGLangParams(Ranged):
    """The SGLang servers the generate stage sends /generate requests to."""

    KEY = "generate.sglang"

    urls: list[str] = param(
        help="One or more servers (or one sglang_router).",
        factory=lambda: ["http://127.0.0.1:30000"],
    )
    concurrency: int = param(256, "Requests in flight per server.", ge=1)
    timeout_s: float = param(
        3600.0, "Longest wait for one reply (long reasoning takes minutes).", gt=0
    )
    connect_timeout_s: float = param(10.0, "Longest wait for a connection.", gt=0)
    max_retries: int = param(
        8,
        "Retries per request on connection loss, timeouts, 5xx, 408 and 429 (never other 4xx).",
        ge=0,
    )
    backoff_s: float = param(1.0, "First retry delay; doubles per retry, with full jitter.", gt=0)
    backoff_max_s: float = param(60.0, "Longest retry delay.", gt=0)
    launch: SGLangLaunchParams | None = param(
        None, "Start a server for the stage (null: use the servers already at urls)."
    )
    api_key_env: str | None = param(
        None,
        "The NAME of the environment variable holding the servers' key (SGLang's --api-key), "
        "sent as `Authorization: Bearer <key>`; never the key itself (null: no key).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_env_name(self.api_key_env, "generate.sglang.api_key_env")


@dataclass(frozen=True)
class GenerateParams(Ranged):
    """How the target writes the responses."""

    KEY = "generate"

    engine: Literal["hf", "sglang"] = param(
        "hf", "hf: transformers in-process; sglang: the servers' raw-token /generate."
    )
    batch_size: int = param(16, "Prompts decoded together by the hf engine.", ge=1)
    max_new_tokens: int = param(1024, "Longest reply, in tokens.", ge=1)
    temperature: float = param(0.0, "Sampling temperature (0: greedy).", ge=0)
    top_p: float = param(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = param(-1, "Sample among the k likeliest tokens (-1: the whole vocabulary).", ge=-1)
    seed: int = param(0, "Sampling seed (each sample's own is derived from it).")
    append_every: int = param(
        64, "Samples per atomic append to the output (a kill loses at most these).", ge=1
    )
    sglang: SGLangParams = param(help="Used when engine is sglang.", factory=SGLangParams)


MIN_MERGE_MEMORY_GB = 2.0


@dataclass(frozen=True)
class MergeParams(Ranged):
    """Dedupe, shuffle, split and cut the generated samples."""

    KEY = "merge"

    seed: int = param(0, "Seed of the shuffle and the split.")
    eval_fraction: float = param(0.05, "Share of samples held out for evaluation.", ge=0, le=1)
    max_length: int = param(4096, "Longest training sequence, in tokens.", ge=1)
    memory_limit_gb: float = param(
        4.0,
        "DuckDB's buffers; what does not fit goes to a temporary folder inside the output "
        "folder. Shapes no output.",
        ge=MIN_MERGE_MEMORY_GB,
    )
    threads: int | None = param(
        None, "DuckDB's workers (one writes the split files); null: every core.", ge=1
    )


@dataclass(frozen=True)
class QualityParams(Ranged):
    """The gate before the expensive stages: each rate against its threshold."""

    KEY = "quality"

    min_reasoning_closed: float = param(
        0.9, "Share of outputs whose reasoning closes (datasets expecting reasoning).", ge=0, le=1
    )
    max_empty_reasoning: float = param(0.5, "Share of empty reasoning allowed.", ge=0, le=1)
    max_truncated: float = param(0.1, "Share of outputs cut at max_new_tokens allowed.", ge=0, le=1)
    min_tool_call_share: float = param(
        0.5, "Share of outputs with a tool call (datasets expecting tool calls).", ge=0, le=1
    )
    max_unbalanced_tool_calls: float = param(
        0.0, "Share of outputs with an unclosed tool call allowed.", ge=0, le=1
    )
    max_failed: float = param(0.05, "Share of failed generations allowed.", ge=0, le=1)
    histogram_buckets: int = param(10, "Buckets of the length histograms.", ge=1)


@dataclass(frozen=True)
class VocabParams(Ranged):
    """The draft's vocabulary."""

    KEY = "vocab"

    draft_vocab_size: int = param(
        32000, "Target ids the drafter can propose (the most frequent supervised ones).", ge=1
    )


@dataclass(frozen=True)
class ExtractSGLangParams(Ranged):
    """The `sglang` capture engine: SGLang's model runner in-process, one rank per GPU under
    `torchrun --nproc-per-node tp_size`, tensor parallel over the ranks."""

    KEY = "extract.sglang"

    tp_size: int = param(8, "Tensor-parallel ranks: torchrun must start exactly this many.", ge=1)
    ep_size: int = param(1, "Expert-parallel size for MoE targets (divides tp_size).", ge=1)
    mem_fraction_static: float = param(
        0.85,
        "GPU memory share for weights and the KV pool (the whole GPU would leave nothing for "
        "activations).",
        gt=0,
        lt=1,
    )
    max_tokens_per_forward: int = param(
        32768,
        "Samples are packed by length up to this many tokens (a longer one runs alone).",
        ge=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the param() ranges: sizes >= 1, the share in (0, 1)
        if self.tp_size % self.ep_size:
            raise ParamsError(
                f"extract.sglang: ep_size {self.ep_size} must divide tp_size {self.tp_size}"
            )


@dataclass(frozen=True)
class ExtractCanaryParams(Ranged):
    """`python -m stages.commands.canary`: the configured engine against a second source."""

    KEY = "extract.canary"

    reference: Literal["hf", "http"] = param(
        "hf",
        "hf: transformers on a target that fits; http: a SGLang 0.5.23 server launched with "
        "--enable-return-aux-hidden-states (the canary prints the flags), aux layers only.",
    )
    url: str | None = param(None, "The http reference's server.")
    hf_device: str = param(
        "cpu", "Where the hf reference runs (the GPUs hold the engine).", pattern=DEVICE
    )
    max_rel_error: float | None = param(
        None,
        "Per layer, ||got - ref|| / ||ref|| over the samples' tokens above which the canary "
        "exits 1; null: 4x the reference's measured noise floor per layer, at least 1e-4.",
        gt=0,
    )
    timeout_s: float = param(600.0, "Per HTTP request.", gt=0)
    api_key_env: str | None = param(
        None, "The NAME of the environment variable holding the server's key."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_env_name(self.api_key_env, "extract.canary.api_key_env")
        if self.reference == "http" and not self.url:
            raise ParamsError("extract.canary.url: required when reference is http")


@dataclass(frozen=True)
class ExtractParams(Ranged):
    """The target's hidden states of every merged sample."""

    KEY = "extract"

    engine: Literal["hf", "sglang"] = param(
        "hf",
        "hf: a whole target per process (data parallel under torchrun); sglang: SGLang's model "
        "runner in-process, tensor parallel over torchrun's ranks.",
    )
    layers: list[int] | None = param(
        None, "HF hidden_states indices of the aux layers (null: [2, N//2, N-3])."
    )
    shard_tokens: int = param(65536, "Tokens per safetensors shard (the unit of resume).", ge=1)
    batch_tokens: int = param(
        16384, "Tokens per forward (hf): samples packed in order, none padded.", ge=1
    )
    compile: bool = param(
        False, "hf: torch.compile each decoder layer (the first forward compiles)."
    )
    writers: int = param(
        3, "Threads writing shards (serialise, fsync, sha256); host buffers: writers + 2.", ge=1
    )
    dtype: Literal["bfloat16", "float32"] = param("bfloat16", "Storage dtype of the features.")
    splits: list[str] = param(
        help="The merged splits to extract.", factory=lambda: ["train", "eval"]
    )
    store: Literal["all", "supervised", "none"] = param(
        "all",
        "all: every row's features; supervised: only what the loss reads; none: token ids only, "
        "the train stage runs the target on each batch (online; with engine sglang, tensor "
        "parallel over the train stage's torchrun ranks).",
    )
    sglang: ExtractSGLangParams = param(
        help="Used when engine is sglang (by the train stage too, with store none).",
        factory=ExtractSGLangParams,
    )
    canary: ExtractCanaryParams = param(help="The canary's reference.", factory=ExtractCanaryParams)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None and (not self.layers or sorted(set(self.layers)) != self.layers):
            raise ParamsError(
                f"extract.layers: {self.layers} must be distinct HF hidden-state indices in "
                f"ascending order, e.g. [2, 16, 29] (or null for [2, N//2, N-3])"
            )


@dataclass(frozen=True)
class TrainParams(Ranged):
    """The EAGLE-3 draft, trained with training-time test."""

    KEY = "train"

    ttt_steps: int = param(7, "Training-time-test unroll (7 in EAGLE-3).", ge=1)
    decay: float = param(0.8, "Weight of TTT step k is decay**k.", gt=0, le=1)
    epochs: float = param(1.0, "Passes over the training split.", gt=0)
    max_steps: int | None = param(None, "Optimizer steps; overrides epochs when set.", ge=1)
    batch_size: int = param(8, "Samples per optimizer step, over all ranks.", ge=1)
    length_window: int = param(
        16,
        "Each run of this many batches is cut from its samples sorted by length, then "
        "shuffled, so batches pad little (1: a plain shuffle).",
        ge=1,
    )
    max_length: int = param(2048, "Longest training sequence, in tokens.", ge=1)
    lr: float = param(1e-4, "Peak learning rate.", gt=0)
    min_lr_ratio: float = param(0.0, "The cosine decays to lr * min_lr_ratio.", ge=0, le=1)
    warmup_ratio: float = param(0.02, "Share of the steps warming up.", ge=0, le=1)
    weight_decay: float = param(0.0, "AdamW weight decay.", ge=0)
    grad_clip: float = param(0.5, "Gradient-norm clip.", gt=0)
    eval_every: int = param(200, "Steps between acceptance evaluations.", ge=1)
    eval_num_steps: int = param(3, "Chain length of the replayed and simulated acceptance.", ge=1)
    eval_max_samples: int = param(256, "Eval samples per evaluation.", ge=1)
    checkpoint_every: int = param(200, "Steps between checkpoints (the unit of resume).", ge=1)
    seed: int = param(0, "Seed of the initialisation and the sample order.")
    device: str = param("auto", "auto | cpu | cuda | cuda:N.", pattern=DEVICE)
    cpu_threads: int | None = param(None, "torch threads on the CPU (null: torch's default).", ge=1)
    compile: Literal["auto", True, False] = param(
        "auto",
        "auto | true: on a GPU, torch.compile the whole objective (TTT unroll, loss, metrics) "
        "into one graph, the first step compiling (reported as warmup_s), eager if that fails; "
        "the CPU runs eager (compiling does not pay there). false: eager everywhere.",
    )
    fp8: bool = param(
        False,
        "With compile: the draft's linear products in FP8 e4m3 with row-wise scales while "
        "training (GPUs of compute capability 8.9+); evaluation and export stay bf16.",
    )
    draft: dict = param(
        help="Overrides of the draft layer's shapes (default: mirror the target; MLA targets: "
        "head_dim 128, kv heads = heads), and rope: mirror | plain.",
        factory=dict,
    )
    sglang_version: str | None = param(
        None,
        "The SGLang release serving the drafter (e.g. '0.5.23'); null: layer ids and rope that "
        "every release serves alike, else refused before training.",
    )


@dataclass(frozen=True)
class BenchmarkSource(Ranged):
    """An extra prompt file for the benchmark."""

    format: str = param(help="Its format (a source adapter, e.g. mt_bench).")
    path: str = param(help="The file.")
    columns: dict | None = param(None, "Column overrides of the adapter.")


@dataclass(frozen=True)
class BenchmarkSGLangParams(Ranged):
    """The drafter on SGLang: the target served with the drafter and without, measured alike.

    Either attach to two running servers (`spec_url`, `base_url`) or `launch` them from params,
    one after the other on the same host and port, so they never share the GPUs.
    """

    KEY = "benchmark.sglang"

    spec_url: str | None = param(
        None, "A running server of the target with this drafter (--speculative-algorithm EAGLE3)."
    )
    base_url: str | None = param(None, "A running server of the same target without speculation.")
    launch: SGLangLaunchParams | None = param(
        None, "Instead of the urls: start each server in turn (the speculative flags are added)."
    )
    concurrency: int = param(16, "Requests in flight per server while measuring.", ge=1)
    timeout_s: float = param(3600.0, "Longest wait for one reply.", gt=0)
    max_retries: int = param(2, "Retries per request (reported: they cost throughput).", ge=0)
    api_key_env: str | None = param(
        None, "The NAME of the environment variable holding the servers' key."
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_env_name(self.api_key_env, "benchmark.sglang.api_key_env")


@dataclass(frozen=True)
class BenchmarkParams(Ranged):
    """Acceptance length (and, served, speedup) of the trained drafter."""

    KEY = "benchmark"

    mode: Literal["hf", "sglang"] = param(
        "hf", "hf: in-process transformers, no GPU needed; sglang: served, with throughput."
    )
    num_steps: int = param(
        3, "Chain drafting depth (topk 1): num_steps + 1 tokens verified at most.", ge=1
    )
    temperatures: list[float] = param(help="Temperatures measured.", factory=lambda: [0.0, 0.7])
    max_new_tokens: int = param(256, "Reply length per prompt.", ge=1)
    max_prompts: int = param(8, "Prompts per dataset.", ge=1)
    seed: int = param(0, "Sampling seed.")
    datasets: dict[str, BenchmarkSource] = param(
        help="Extra prompt files, e.g. {mt_bench: {format: mt_bench, path: ...}}.", factory=dict
    )
    sglang: BenchmarkSGLangParams = param(
        help="Used when mode is sglang.", factory=BenchmarkSGLangParams
    )


@dataclass(frozen=True)
class CardParams(Ranged):
    """The drafter's model card (Hugging Face front matter and title)."""

    KEY = "report.card"

    title: str | None = param(None, "Its title (null: 'EAGLE-3 draft model for <target>').")
    base_model: str | None = param(
        None, "The target's Hugging Face id, e.g. moonshotai/Kimi-K2.5 (null: no base_model key)."
    )
    license: str = param("apache-2.0", "The card's license.")
    tags: list[str] = param(
        help="The card's tags.", factory=lambda: ["eagle3", "speculative-decoding", "draft-model"]
    )


@dataclass(frozen=True)
class ReportParams(Ranged):
    """reports/index.html, reports/metrics.json and models/card/README.md."""

    KEY = "report"

    samples_per_dataset: int = param(3, "Sample records shown per dataset, decoded.", ge=0)
    prompt_tokens: int = param(256, "The end of each sample's prompt shown, in tokens.", ge=0)
    max_chars: int = param(
        4000, "Per part of a sample (reasoning, answer, tool calls); the rest is cut.", ge=1
    )
    max_failures: int = param(100, "Failed turns listed with their messages.", ge=0)
    card: CardParams = param(help="The drafter's model card.", factory=CardParams)


# The top-level sections of params.yaml and their typed view (`datasets`: one DatasetParams per
# named dataset).
SECTIONS: dict[str, type] = {
    "target": TargetParams,
    "datasets": DatasetParams,
    "generate": GenerateParams,
    "merge": MergeParams,
    "quality": QualityParams,
    "vocab": VocabParams,
    "extract": ExtractParams,
    "train": TrainParams,
    "benchmark": BenchmarkParams,
    "report": ReportParams,
}


def _check(value: Any, tp: Any, key: str) -> Any:
    """Validate (and build, for nested dataclasses) one value against its annotation."""
    origin = typing.get_origin(tp)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(value, inner[0], key)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ParamsError(f"{key}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        if args and isinstance(args[1], type) and dataclasses.is_dataclass(args[1]):
            return {k: build(args[1], v, f"{key}.{k}") for k, v in value.items()}
        return value
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise ParamsError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(tp)
        return [_check(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)] if args else value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool):
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ParamsError(
                f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}"
            )
        return value
    return value


def unknown_key(key: str, name: str, known: list[str]) -> str:
    """An unknown key's error: the key (`name` its last part), the nearest known one if any is
    close, and all of them."""
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6) or [
        k
        for k in known
        if k == "".join(w[:1] for w in str(name).split("_"))  # learning_rate: lr
    ]
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: unknown key{hint} (known: {', '.join(known)})"


def check_all(path: Path | str = PARAMS_FILE) -> None:
    """Every section of the file built as its stage builds it: the first unknown key, wrong type
    or value out of range raises ParamsError naming it."""
    raw = load_params(path)
    for name in raw:
        if name not in SECTIONS:
            raise ParamsError(unknown_key(f"{path}:{name}", str(name), list(SECTIONS)))
    for name, cls in SECTIONS.items():
        if name == "datasets":
            datasets(path)
        elif name in raw or any(
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            for f in dataclasses.fields(cls)
        ):
            section(cls, name, path)
    _check_layers(raw, path)


def _check_layers(raw: dict, path: Path | str) -> None:
    """extract.layers against the target's depth, where its config.json is at hand."""
    layers = (raw.get("extract") or {}).get("layers")
    target = Path(str((raw.get("target") or {}).get("path", "")))
    if not layers or not (target / "config.json").is_file():
        return
    cfg = yaml.safe_load((target / "config.json").read_text())  # JSON is YAML
    depth = (cfg.get("text_config") or cfg).get("num_hidden_layers")
    outside = [i for i in layers if not 0 <= i <= depth - 1] if isinstance(depth, int) else []
    if outside:
        raise ParamsError(
            f"{path}:extract.layers: HF hidden-state indices {outside} are outside "
            f"0..{depth - 1} for a {depth}-layer target ({target})"
        )


def _check_range(value: Any, f: dataclasses.Field, key: str) -> None:
    """A number outside the key's range (param's ge / gt / le / lt), or a string off its
    pattern, names the key and what is allowed."""
    pattern = f.metadata.get("pattern")
    if pattern and isinstance(value, str) and not re.fullmatch(pattern, value):
        raise ParamsError(f"{key}: {value!r} is not one of {allowed_range(f)}")
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return
    ge, gt, le, lt = (f.metadata.get(k) for k in ("ge", "gt", "le", "lt"))
    if (
        (ge is not None and value < ge)
        or (gt is not None and value <= gt)
        or (le is not None and value > le)
        or (lt is not None and value >= lt)
    ):
        raise ParamsError(f"{key}: {value!r} is out of range; allowed: {allowed_range(f)}")


def allowed_range(f: dataclasses.Field) -> str:
    """The range a key's number must lie in, as docs/params.md and errors write it."""
    ge, gt, le, lt = (f.metadata.get(k) for k in ("ge", "gt", "le", "lt"))
    if f.metadata.get("pattern"):
        return str(f.metadata["pattern"]).replace("|", " | ").replace(r"\d+", "N")
    low = f">= {ge:g}" if ge is not None else f"> {gt:g}" if gt is not None else ""
    high = f"<= {le:g}" if le is not None else f"< {lt:g}" if lt is not None else ""
    return " and ".join(p for p in (low, high) if p)


def build(cls: type, raw: Any, key: str):
    """Build dataclass `cls` from a params mapping; unknown or missing keys name their path."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{key}: expected a mapping, got {type(raw).__name__} {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ParamsError(unknown_key(f"{key}.{unknown[0]}", unknown[0], sorted(fields)))
    values = {}
    for name, f in fields.items():
        if name in raw and name in SECRET_NAME_KEYS:
            try:
                values[name] = _check(raw[name], hints[name], f"{key}.{name}")
            except ParamsError:
                raise ParamsError(
                    f"{key}.{name}: expected the name of an environment variable (a string) or "
                    f"null (the value is not shown: it may be a key)"
                ) from None
        elif name in raw:
            values[name] = _check(raw[name], hints[name], f"{key}.{name}")
            _check_range(values[name], f, f"{key}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamsError(f"{key}.{name}: required key is missing")
    return cls(**values)


def load_params(path: Path | str = PARAMS_FILE) -> dict:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: not found; run from the project root or pass --params")
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ParamsError(f"{path}: not valid YAML{where} ({problem}); fix the file") from None
    except UnicodeDecodeError as err:
        raise ParamsError(
            f"{path}: not a YAML text file (not UTF-8 at byte {err.start}); is it the params file?"
        ) from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return raw


def section(cls: type, name: str, path: Path | str = PARAMS_FILE):
    """The typed view of one top-level section of params.yaml."""
    raw = load_params(path)
    return build(cls, raw.get(name), f"{path}:{name}")


def datasets(path: Path | str = PARAMS_FILE) -> dict[str, DatasetParams]:
    raw = load_params(path).get("datasets")
    if not raw:
        raise ParamsError(f"{path}:datasets: at least one dataset is required")
    if isinstance(raw, dict):
        for name in raw:
            check_dataset_name(name, f"{path}:datasets")
    return _check(raw, dict[str, DatasetParams], f"{path}:datasets")


def check_dataset_name(name: object, key: str) -> None:
    """A dataset name is a file and stage name: no `/`, no `..`, no NUL or other control
    character, nothing that would put a file outside data/prompts/ or data/raw/."""
    if not isinstance(name, str) or not DATASET_NAME.match(name) or ".." in name:
        raise ParamsError(
            f"{key}: dataset name {name!r} cannot name files and stages (data/raw/<name>/, "
            f"prep@<name>): use letters, digits, _, - and . (not first, and no '..'), at most "
            f"128 characters"
        )


def dataset(name: str, path: Path | str = PARAMS_FILE) -> DatasetParams:
    all_ = datasets(path)
    if name not in all_:
        raise ParamsError(f"{path}:datasets.{name}: no such dataset; defined: {sorted(all_)}")
    return all_[name]
