"""The `extract` section: the capture engine, its layers and storage, and the canary's reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..runtime.errors import ParamsError
from .schema import DEVICE, Ranged, Section, check_env_name, param


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
class ExtractParams(Section):
    """The target's hidden states of every merged sample."""

    KEY = "extract"

    engine: Literal["hf", "sglang"] = param(
        "hf",
        "hf: a whole target per process (data parallel under torchrun); sglang: SGLang's model "
        "runner in-process, tensor parallel over torchrun's ranks.",
    )
    drafters: list[Literal["eagle3", "dflash"]] = param(
        help="The drafter families this run trains: the features hold the union of the layers "
        "they read (EAGLE-3: extract.layers; DFlash: dflash.target_layer_ids), captured once. "
        "eagle3 is always among them; dflash left out is not trained (its stages write reports "
        "saying so).",
        factory=lambda: ["eagle3"],
    )
    layers: list[int] | None = param(
        None, "HF hidden_states indices EAGLE-3 reads (null: [2, N//2, N-3])."
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
        if "eagle3" not in self.drafters or len(set(self.drafters)) != len(self.drafters):
            raise ParamsError(
                f"extract.drafters: {self.drafters} must name each family once, eagle3 among "
                "them (the report, card and launch line are its): [eagle3] or [eagle3, dflash]"
            )
        if self.layers is not None and (not self.layers or sorted(set(self.layers)) != self.layers):
            raise ParamsError(
                f"extract.layers: {self.layers} must be distinct HF hidden-state indices in "
                f"ascending order, e.g. [2, 16, 29] (or null for [2, N//2, N-3])"
            )
