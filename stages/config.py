"""Typed, validated view of params.yaml.

Each stage reads only its own section. A wrong key or type fails before any work starts, with the
dotted key path and what is expected, so a typo in params.yaml never silently falls back to a
default.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

PARAMS_FILE = Path("params.yaml")


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


@dataclass(frozen=True)
class TargetParams:
    path: str
    chat_template: str | None = None  # a Jinja file, for models that ship none
    template_kwargs: dict = field(default_factory=dict)  # e.g. {thinking: true}
    roles: dict = field(default_factory=dict)  # role -> token string, overrides what is learned
    trust_remote_code: bool = False
    device: str = "auto"
    dtype: str = "auto"
    cpu_threads: int | None = None  # torch threads on CPU; None = torch's default


@dataclass(frozen=True)
class PrepParams:
    format: str
    path: str
    columns: dict | None = None
    max_samples: int | None = None
    max_prompt_tokens: int = 2048  # all_turns: the limit of every turn's prompt
    skip_bad_rows: bool = False
    seed: int = 0
    # last_turn: the target writes the reply to the last user turn or tool result;
    # all_turns: every assistant turn in order, each on the target's own earlier turns, the
    # later prompts built by concatenating ids; all_turns_rendered: the same, the later prompts
    # rendered by the chat template from the conversation so far (as a chat client and server)
    regenerate: Literal["last_turn", "all_turns", "all_turns_rendered"] = "last_turn"


@dataclass(frozen=True)
class DatasetGenerateParams:
    budget_tokens: int = 10_000_000


@dataclass(frozen=True)
class ExpectParams:
    """What the quality gate demands of a dataset's outputs."""

    reasoning: bool = True
    tool_calls: bool = False


@dataclass(frozen=True)
class DatasetParams:
    prep: PrepParams
    generate: DatasetGenerateParams = field(default_factory=DatasetGenerateParams)
    expect: ExpectParams = field(default_factory=ExpectParams)


@dataclass(frozen=True)
class SGLangServerArgs:
    """Flags of `python -m sglang.launch_server`, named as SGLang names them (None: its default)."""

    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None
    context_length: int | None = None
    max_running_requests: int | None = None
    kv_cache_dtype: str = "auto"
    enable_hierarchical_cache: bool = False
    hicache_size: int | None = None  # GB of host memory per rank for the hierarchical cache
    enable_metrics: bool = True
    skip_tokenizer_init: bool = False


@dataclass(frozen=True)
class SGLangLaunchParams:
    """Start one server for the stage and stop it when the stage ends."""

    model_path: str | None = None  # None: target.path
    module: str = "sglang.launch_server"  # stages.engines.hf_server serves the same API on CPU
    server_args: SGLangServerArgs = field(default_factory=SGLangServerArgs)
    extra_args: list[str] = field(default_factory=list)  # any other launch_server flags
    health_timeout_s: float = 1800.0
    log_file: str | None = None  # None: a temporary file, printed at launch


@dataclass(frozen=True)
class SGLangParams:
    urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:30000"])
    concurrency: int = 256  # requests in flight per server
    timeout_s: float = 3600.0  # longest wait for one reply (long reasoning takes minutes)
    connect_timeout_s: float = 10.0
    max_retries: int = 8  # per request, on connection loss, timeouts, 5xx, 408 and 429
    backoff_s: float = 1.0  # first retry delay; doubles per retry, full jitter
    backoff_max_s: float = 60.0
    launch: SGLangLaunchParams | None = None  # None: use the servers already running at urls
    # the NAME of the environment variable holding the servers' API key (SGLang's --api-key),
    # sent as `Authorization: Bearer <key>`; None: no key. Never the key itself.
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        check_env_name(self.api_key_env, "generate.sglang.api_key_env")


@dataclass(frozen=True)
class GenerateParams:
    engine: Literal["hf", "sglang"] = "hf"
    batch_size: int = 16
    max_new_tokens: int = 1024
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0
    append_every: int = 64  # samples per atomic append to the output
    sglang: SGLangParams = field(default_factory=SGLangParams)


MIN_MERGE_MEMORY_GB = 2.0


@dataclass(frozen=True)
class MergeParams:
    seed: int = 0
    eval_fraction: float = 0.05
    max_length: int = 4096
    # DuckDB's buffers; what does not fit goes to a temporary folder inside the output folder
    # (the process peaks about 0.5 GB above this, whatever the data's size); shapes no output
    memory_limit_gb: float = 4.0
    # DuckDB's workers planning and checking (one writes the split files); None: every core
    # this process may use
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.memory_limit_gb < MIN_MERGE_MEMORY_GB:
            raise ParamsError(
                f"merge.memory_limit_gb: {self.memory_limit_gb} is below "
                f"{MIN_MERGE_MEMORY_GB}, the least the merge's sort and joins run in"
            )
        if self.threads is not None and self.threads < 1:
            raise ParamsError(f"merge.threads: {self.threads} must be >= 1 (or null: every core)")


@dataclass(frozen=True)
class QualityParams:
    min_reasoning_closed: float = 0.9  # per dataset expecting reasoning
    max_empty_reasoning: float = 0.5
    max_truncated: float = 0.1
    min_tool_call_share: float = 0.5  # per dataset expecting tool calls
    max_unbalanced_tool_calls: float = 0.0
    max_failed: float = 0.05
    histogram_buckets: int = 10


@dataclass(frozen=True)
class VocabParams:
    draft_vocab_size: int = 32000


@dataclass(frozen=True)
class ExtractSGLangParams:
    """The `sglang` capture engine: SGLang's model runner in-process, one rank per GPU under
    `torchrun --nproc-per-node tp_size`, tensor parallel over the ranks."""

    tp_size: int = 8  # tensor-parallel ranks: torchrun must start exactly this many processes
    ep_size: int = 1  # expert-parallel size for MoE targets (divides tp_size)
    mem_fraction_static: float = 0.85  # GPU memory share for weights and the KV pool
    max_tokens_per_forward: int = 32768  # samples are packed by length up to this many tokens

    def __post_init__(self) -> None:
        if self.tp_size < 1 or self.ep_size < 1 or self.tp_size % self.ep_size:
            raise ParamsError(
                f"extract.sglang: ep_size {self.ep_size} must divide tp_size {self.tp_size} "
                f"(both >= 1)"
            )
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ParamsError(
                f"extract.sglang.mem_fraction_static: {self.mem_fraction_static} is not in (0, 1)"
            )
        if self.max_tokens_per_forward < 1:
            raise ParamsError("extract.sglang.max_tokens_per_forward: must be >= 1")


@dataclass(frozen=True)
class ExtractCanaryParams:
    """`python -m stages.canary`: the configured engine against a second source."""

    reference: Literal["hf", "http"] = "hf"  # hf: transformers on a target that fits; http: a
    url: str | None = None  # SGLang >= 0.5.23 server with --enable-return-aux-hidden-states
    hf_device: str = "cpu"  # where the hf reference runs (the GPUs hold the engine)
    max_rel_error: float = 0.05  # per layer: ||got - ref|| / ||ref|| over the samples' tokens
    timeout_s: float = 600.0  # per HTTP request
    api_key_env: str | None = None  # the NAME of the env variable holding the server's key

    def __post_init__(self) -> None:
        check_env_name(self.api_key_env, "extract.canary.api_key_env")
        if self.reference == "http" and not self.url:
            raise ParamsError("extract.canary.url: required when reference is http")
        if not self.max_rel_error > 0:
            raise ParamsError("extract.canary.max_rel_error: must be > 0")


@dataclass(frozen=True)
class ExtractParams:
    engine: Literal["hf", "sglang"] = "hf"  # hf: a full target per process; sglang: TP capture
    layers: list[int] | None = None  # HF hidden_states indices; None = [2, N//2, N-3]
    shard_tokens: int = 65536  # tokens per safetensors shard (the unit of resume)
    batch_tokens: int = 16384  # tokens per forward, samples packed in order (hf engine)
    compile: bool = False  # torch.compile each decoder layer (hf; one graph for every length)
    writers: int = 3  # threads writing shards (write + sha256, fsync); buffers: writers + 2
    dtype: Literal["bfloat16", "float32"] = "bfloat16"  # storage dtype of the features
    splits: list[str] = field(default_factory=lambda: ["train", "eval"])
    # all: every row's features; supervised: only what the loss reads (rows up to each sample's
    # last supervised token, the final state only where the next token is supervised); none:
    # token ids only, train runs the target on each batch (online; a target beside the draft)
    store: Literal["all", "supervised", "none"] = "all"
    sglang: ExtractSGLangParams = field(default_factory=ExtractSGLangParams)
    canary: ExtractCanaryParams = field(default_factory=ExtractCanaryParams)

    def __post_init__(self) -> None:
        for key in ("shard_tokens", "batch_tokens", "writers"):
            if getattr(self, key) < 1:
                raise ParamsError(f"extract.{key}: {getattr(self, key)} must be >= 1")
        if self.store == "none" and self.engine != "hf":
            raise ParamsError(
                f"extract.store: none runs the target inside the train stage with transformers, "
                f"as engine hf does, not {self.engine} (a target that needs a node): use store "
                f"all or supervised, or engine hf"
            )


@dataclass(frozen=True)
class TrainParams:
    ttt_steps: int = 7
    decay: float = 0.8  # weight of TTT step k is decay**k
    epochs: float = 1.0
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 8  # samples per optimizer step, over all ranks
    length_window: int = 16  # batches whose samples are grouped by length (1: a plain shuffle)
    max_length: int = 2048
    lr: float = 1e-4
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    warmup_ratio: float = 0.02
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    eval_every: int = 200  # steps between acceptance evaluations
    eval_num_steps: int = 3  # chain length the replayed and simulated acceptance use
    eval_max_samples: int = 256
    checkpoint_every: int = 200
    seed: int = 0
    device: str = "auto"
    cpu_threads: int | None = None  # torch threads on CPU; None = torch's default
    compile: bool = False  # torch.compile the whole training objective on a GPU (CPU: eager)
    fp8: bool = False  # the draft's linear products in FP8 while training (GPUs of sm 8.9+)
    draft: dict = field(default_factory=dict)  # overrides of the draft layer's shapes
    sglang_version: str | None = None  # the SGLang serving the drafter; None: ids for every one


@dataclass(frozen=True)
class BenchmarkSource:
    format: str
    path: str
    columns: dict | None = None


@dataclass(frozen=True)
class BenchmarkSGLangParams:
    """The drafter on SGLang: the target served with the drafter and without, measured alike.

    Either attach to two running servers (`spec_url`, `base_url`) or `launch` them from params,
    one after the other on the same host and port, so they never share the GPUs.
    """

    spec_url: str | None = None  # the target served with --speculative-algorithm EAGLE3 ...
    base_url: str | None = None  # the same target served without speculation
    launch: SGLangLaunchParams | None = None  # instead of the urls: start each server in turn
    concurrency: int = 16  # requests in flight per server while measuring
    timeout_s: float = 3600.0  # longest wait for one reply
    max_retries: int = 2  # per request; retries are reported, since they cost throughput
    api_key_env: str | None = None  # the NAME of the env variable holding the servers' key

    def __post_init__(self) -> None:
        check_env_name(self.api_key_env, "benchmark.sglang.api_key_env")


@dataclass(frozen=True)
class BenchmarkParams:
    mode: Literal["hf", "sglang"] = "hf"  # in-process transformers | SGLang servers
    num_steps: int = 3  # chain drafting depth (topk 1): num_steps + 1 tokens verified at most
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    max_new_tokens: int = 256
    max_prompts: int = 8  # per dataset
    seed: int = 0
    datasets: dict[str, BenchmarkSource] = field(default_factory=dict)  # extra prompt files
    sglang: BenchmarkSGLangParams = field(default_factory=BenchmarkSGLangParams)


@dataclass(frozen=True)
class CardParams:
    """The drafter's model card (Hugging Face front matter and title)."""

    title: str | None = None  # None: "EAGLE-3 draft model for <target>"
    base_model: str | None = None  # the target's Hugging Face id; None: its local path, no key
    license: str = "apache-2.0"
    tags: list[str] = field(
        default_factory=lambda: ["eagle3", "speculative-decoding", "draft-model"]
    )


@dataclass(frozen=True)
class ReportParams:
    samples_per_dataset: int = 3  # sample records shown per dataset
    prompt_tokens: int = 256  # the end of each sample's prompt shown, in tokens
    max_chars: int = 4000  # per part of a sample (reasoning, answer, ...), the rest cut
    max_failures: int = 100  # failed turns listed with their messages
    card: CardParams = field(default_factory=CardParams)


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
        raise ParamsError(f"{key}: unknown key(s) {unknown}; known keys: {sorted(fields)}")
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
