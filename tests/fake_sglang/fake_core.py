"""What the SGLang stand-ins of every release share: a Hugging Face checkpoint run one sequence at
a time behind SGLang's model, logits-processor and pool interfaces, and the record of what the
engine asked for.

The layer-capture conventions are written here from SGLang's model code (models/llama.py and
models/deepseek_v2.py of the supported releases), independently of stages/drafter/layers.py, the
code under test: llama captures ids + 1; deepseek_v2 captures ids + 1 when the first id is 1,
else the ids as given; no ids: [2, N // 2, N - 3]. Capture j is the input of decoder layer j,
which is HF hidden_states[j]. Classes here that stand for SGLang's are re-exported by the
stand-in modules and held, like theirs, to the real release's signatures
(tests/sglang_contract/stand_in.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from dataclasses import asdict, dataclass
from enum import IntEnum, auto
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForCausalLM

RECORD: list[dict] = []


def record(event: str, **values: Any) -> None:
    """Keep what the runner saw; with FAKE_SGLANG_RECORD also append it to that file (JSON lines,
    with the torchrun rank)."""
    entry = {"event": event, "rank": int(os.environ.get("RANK", "0")), **values}
    RECORD.append(entry)
    path = os.environ.get("FAKE_SGLANG_RECORD", "").replace("{rank}", str(entry["rank"]))
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry, default=str) + "\n")


def join_group(tp_size: int, pp_size: int, rank: int, port: int) -> None:
    """As SGLang's init_distributed_environment: an initialised default group is used as it is and
    must hold tp_size x pp_size ranks in TP order; with none, one rank starts its own over
    tcp://, which under torchrun (its agent store) waits as a client for a store nobody serves
    (torch's `_create_c10d_store`: seen hanging on an H200 with 0.5.17)."""
    if torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        if world != tp_size * pp_size:
            raise RuntimeError(
                f"world_size ({world}) is not equal to tensor_model_parallel_size "
                f"({tp_size}) x pipeline_model_parallel_size ({pp_size})"
            )
        if torch.distributed.get_rank() != rank:
            raise RuntimeError(f"tp_rank {rank} is not this process's rank")
    elif os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise RuntimeError(
            f"would connect to tcp://127.0.0.1:{port} as a client of torchrun's agent store, "
            f"which nobody serves there, and wait"
        )
    elif tp_size * pp_size != 1:
        raise RuntimeError(
            f"would initialise {tp_size * pp_size} ranks at tcp://127.0.0.1:{port} and wait"
        )


class CaptureHiddenMode(IntEnum):
    NULL = auto()
    LAST = auto()
    FULL = auto()

    def need_capture(self) -> bool:
        return self != CaptureHiddenMode.NULL

    def is_full(self) -> bool:
        return self == CaptureHiddenMode.FULL

    def is_last(self) -> bool:
        return self == CaptureHiddenMode.LAST


class SpeculativeAlgorithm(IntEnum):
    NONE = auto()
    EAGLE = auto()
    EAGLE3 = auto()


class SamplingParams:
    def __init__(self, *, max_new_tokens: int = 128, temperature: float = 1.0):
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature


class ModelConfig:
    def __init__(self, model_path: str):
        self.model_path = model_path
        self.hf_config = json.loads((Path(model_path) / "config.json").read_text())
        text = self.hf_config.get("text_config") or self.hf_config  # a wrapper's language model
        self.num_hidden_layers = int(text["num_hidden_layers"])

    @staticmethod
    def from_server_args(server_args, model_path=None, **kwargs) -> ModelConfig:
        return ModelConfig(model_path or server_args.model_path)


class ReqToTokenPool:
    """Requests one forward may hold; `clear` frees them all."""

    def __init__(self, size: int):
        self.size = size
        self._used = 0

    def _take(self, n: int) -> None:
        if self._used + n > self.size:
            raise RuntimeError(f"pool of {self.size} cannot take {n} more (holds {self._used})")
        self._used += n

    def clear(self) -> None:
        self._used = 0


def capture_ids(model: str, layer_ids: list[int] | None, num_layers: int) -> list[int]:
    """What SGLang's `model` code (llama | deepseek_v2) captures for `layer_ids`."""
    if layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]
    ids = [int(i) for i in layer_ids]
    if model == "llama" or ids[0] == 1:
        return [i + 1 for i in ids]
    return ids


class LogitsProcessor(nn.Module):
    """As SGLang's: the logits of each sequence's last token from the post-norm states, and with
    capture mode FULL the aux captures side by side (or, with none, the final states) as
    `hidden_states`. The stand-in's `config` names the release's output class and whether it
    also returns the final states (0.5.23, in a capture-only run)."""

    def __init__(self, config, skip_all_gather=False, logit_scale=None, return_full_logits=False):
        super().__init__()
        self._output_class, self._keep_last = config["output"], config["keep_last"]

    def forward(
        self,
        input_ids,
        hidden_states,
        lm_head,
        logits_metadata,
        aux_hidden_states=None,
        hidden_states_before_norm=None,
    ):
        ends = torch.tensor(logits_metadata.extend_seq_lens_cpu).cumsum(0) - 1
        out = self._output_class(next_token_logits=lm_head(hidden_states[ends]))
        if logits_metadata.capture_hidden_mode.is_full():
            out.hidden_states = (
                torch.cat(aux_hidden_states, dim=-1) if aux_hidden_states else hidden_states
            )
            if self._keep_last and aux_hidden_states:
                out.last_hidden_states = hidden_states
        return out


def hf_language_model(path: str) -> nn.Module:
    """The checkpoint's causal LM in fp32: as saved, or the language model of Kimi-K2.5's
    multimodal layout (its DeepSeek-V3 config under `text_config`, its tensors under
    `language_model.`), which SGLang builds as DeepseekV3ForCausalLM and transformers cannot
    load as a whole: loaded from a plain copy of those."""
    config = json.loads((Path(path) / "config.json").read_text())
    if "text_config" not in config:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        ).eval()
    prefix = "language_model."
    with tempfile.TemporaryDirectory() as plain:
        text = {**config["text_config"], "model_type": "deepseek_v3"}
        text["architectures"] = ["DeepseekV3ForCausalLM"]
        (Path(plain) / "config.json").write_text(json.dumps(text))
        for shard in sorted(Path(path).glob("*.safetensors")):
            tensors = load_file(str(shard))
            kept = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
            save_file(kept, str(Path(plain) / shard.name), metadata={"format": "pt"})
        index = Path(path) / "model.safetensors.index.json"
        if index.exists():
            weights = json.loads(index.read_text())["weight_map"]
            plain_map = {k.removeprefix(prefix): v for k, v in weights.items()}
            (Path(plain) / index.name).write_text(
                json.dumps({"metadata": {}, "weight_map": plain_map})
            )
        return AutoModelForCausalLM.from_pretrained(
            plain, dtype=torch.float32, local_files_only=True
        ).eval()


class _CausalLM(nn.Module):
    """The checkpoint's HF model behind SGLang's model interface."""

    _family = ""

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self._hf = hf_language_model(config["path"])
        self._num_layers = int(self._hf.config.num_hidden_layers)
        self._capture: list[int] | None = None
        self.logits_processor = LogitsProcessor(config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self._capture = capture_ids(self._family, layer_ids, self._num_layers)
        record("set_eagle3_layers_to_capture", ids=layer_ids, captures=self._capture)

    @torch.inference_mode()
    def _run(self, input_ids, forward_batch):
        finals, aux = [], []
        start = 0
        for n in forward_batch.extend_seq_lens_cpu:
            ids = input_ids[start : start + n][None]
            start += n
            out = self._hf(input_ids=ids, output_hidden_states=True, use_cache=False)
            finals.append(out.hidden_states[-1][0])
            if self._capture is not None:
                aux.append([out.hidden_states[j][0] for j in self._capture])
        hidden = torch.cat(finals)
        captured = (
            [torch.cat([a[k] for a in aux]) for k in range(len(self._capture))]
            if self._capture is not None
            else None
        )
        head = self._hf.get_output_embeddings()
        return self.logits_processor(input_ids, hidden, head, forward_batch, captured)


class LlamaForCausalLM(_CausalLM):
    _family = "llama"

    def forward(
        self,
        input_ids,
        positions,
        forward_batch,
        input_embeds=None,
        get_embedding=False,
        pp_proxy_tensors=None,
    ):
        return self._run(input_ids, forward_batch)


# The MoE keys SGLang's models/deepseek_v2.py reads as `config.<key>`, with no default, when it
# builds a DeepSeek-V3 / Kimi-K2 model (its MoE gate, experts and top-k, `_is_layer_sparse`), in
# every release from 0.5.14 to 0.5.23 (scoring_func: from 0.5.15 on; 0.5.14 reads it on its hash
# and V4 routing paths only). Every real config.json holds them; transformers' DeepseekV3Config has
# no moe_layer_freq, topk_method or scoring_func of its own, so without them SGLang's model fails
# to build with an AttributeError, as the stand-in's does.
DEEPSEEK_MOE_KEYS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "n_shared_experts",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "moe_layer_freq",
    "topk_method",
    "scoring_func",
    "norm_topk_prob",
    "n_group",
    "topk_group",
    "routed_scaling_factor",
)


class DeepseekV2ForCausalLM(_CausalLM):
    _family = "deepseek_v2"

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__(config, quant_config, prefix)
        for key in DEEPSEEK_MOE_KEYS:  # SGLang's `config.<key>`: AttributeError when absent
            getattr(self._hf.config, key)

    def forward(
        self, input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None
    ):
        return self._run(input_ids, forward_batch)


class KimiK25ForConditionalGeneration(nn.Module):
    """As SGLang's models/kimi_k25.py: a multimodal wrapper (its vision tower left out here)
    holding the DeepSeek-V3 language model, which has the logits processor; the wrapper has none
    and forwards the capture calls."""

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.language_model = DeepseekV2ForCausalLM(config, quant_config)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.language_model.set_eagle3_layers_to_capture(layer_ids)

    def forward(
        self, input_ids, positions, forward_batch, get_embedding=False, pp_proxy_tensors=None
    ):
        return self.language_model(input_ids, positions, forward_batch)


def load_model(model_config: ModelConfig, output_class: type, keep_last: bool) -> nn.Module:
    """The stand-in model of the checkpoint's architecture, as SGLang's model registry picks it."""
    name = model_config.hf_config["architectures"][0].lower()
    config = {"path": model_config.model_path, "output": output_class, "keep_last": keep_last}
    if name == "kimik25forconditionalgeneration":
        return KimiK25ForConditionalGeneration(config)
    family = DeepseekV2ForCausalLM if ("deepseek" in name or "kimik2" in name) else None
    if family is None and any(k in name for k in ("llama", "qwen", "mistral")):
        family = LlamaForCausalLM
    if family is None:
        raise NotImplementedError(f"the SGLang stand-in has no model code for {name}")
    return family(config)


def prefill_ids(reqs: list, lengths: list[int]) -> torch.Tensor:
    """The tokens of a prefill batch, one request after another."""
    ids: list[int] = []
    for req, n in zip(reqs, lengths):
        ids += list(req.origin_input_ids)[:n]
    return torch.tensor(ids, dtype=torch.long)


# --- the parts both releases' stand-ins share, re-exported or subclassed by them -------------

POOL_SIZE = 64  # a runner's max_running_requests


@dataclass(kw_only=True)
class _ServerArgs:
    """The ServerArgs fields the engine sets on both releases."""

    model_path: str
    trust_remote_code: bool = False
    dtype: str = "auto"
    tp_size: int = 1
    ep_size: int = 1
    pp_size: int = 1
    mem_fraction_static: float | None = None
    disable_radix_cache: bool = False
    chunked_prefill_size: int | None = None
    disable_cuda_graph: bool = False
    skip_tokenizer_init: bool = False
    page_size: int | None = None

    def _record(self) -> None:
        record("server_args", **asdict(self))


@dataclass(kw_only=True)
class ModelRunnerOutput:
    logits_output: object
    can_run_graph: bool


class _ModelRunner:
    """A runner after its constructor, as both releases have it: the caller allocates the pools,
    then the attention backends, then the graphs (the eager runner every forward goes through)."""

    def _load(self, model_config, server_args, gpu_id, output_class, keep_last: bool) -> None:
        self.model_config = model_config
        self.server_args = server_args
        self.gpu_id = gpu_id
        self.device = "cpu"
        self.model = load_model(model_config, output_class, keep_last)
        self.req_to_token_pool = None
        self.token_to_kv_pool_allocator = None
        self.attn_backend = None
        self.eager_runner = None
        self.max_running_requests = None
        self.max_total_num_tokens = None

    def alloc_memory_pool(self, memory_pool_config=None):
        self.max_running_requests = POOL_SIZE
        self.max_total_num_tokens = 10**6
        self.req_to_token_pool = ReqToTokenPool(POOL_SIZE)
        self.token_to_kv_pool_allocator = ReqToTokenPool(self.max_total_num_tokens)

    def init_attention_backends(self):
        if self.req_to_token_pool is None:
            raise RuntimeError("init_attention_backends before alloc_memory_pool")
        self._configure_capture()
        self.attn_backend = "stand-in"

    def _configure_capture(self) -> None:
        """0.5.23 sets the capture ids of a capture-only run here."""

    def init_cuda_graphs(self, capture_decode_cuda_graph=True):
        if self.attn_backend is None:
            raise RuntimeError("init_cuda_graphs before init_attention_backends")
        self.eager_runner = "eager"
        record("init_cuda_graphs", disable_cuda_graph=self.server_args.disable_cuda_graph)

    def forward(
        self,
        forward_batch,
        skip_attn_backend_init=None,
        pp_proxy_tensors=None,
        reinit_attn_backend=False,
        split_forward_count=1,
    ):
        if self.eager_runner is None:
            raise RuntimeError("forward before init_cuda_graphs: no eager runner")
        if forward_batch.input_ids is None:
            raise RuntimeError("the batch's input_ids were never moved to the device")
        record(
            "forward",
            tokens=int(forward_batch.input_ids.numel()),
            lengths=forward_batch.extend_seq_lens_cpu,
            mode=forward_batch.capture_hidden_mode.name,
        )
        out = self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)
        return ModelRunnerOutput(logits_output=out, can_run_graph=False)


class _Req:
    """A request as both releases' constructors take it: the ids must be an array("q")."""

    def __init__(self, rid, origin_input_text, origin_input_ids, sampling_params):
        if not isinstance(origin_input_ids, array):
            raise TypeError(f"origin_input_ids is a {type(origin_input_ids)}, not array('q')")
        self.rid = rid
        self._origin_input_text = origin_input_text
        self.origin_input_ids = origin_input_ids
        self.sampling_params = sampling_params
        self.full_untruncated_fill_ids = array("q")
        self.logprob_start_len = 0
        self._release_fields()

    def _release_fields(self) -> None:
        """What one release's request holds beyond these."""


class _ScheduleBatch:
    """One extend batch: its requests' tokens allocated and laid out on the host."""

    @classmethod
    def init_new(
        cls,
        reqs,
        req_to_token_pool,
        token_to_kv_pool_allocator,
        tree_cache,
        model_config,
        enable_overlap,
        spec_algorithm,
        chunked_req=None,
        dllm_config=None,
    ):
        self = cls.__new__(cls)
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.tree_cache = tree_cache
        self.model_config = model_config
        self.device = "cpu"
        self.input_ids = None
        self.prefill_input_ids_cpu = None
        self.extend_lens = []
        self._release_fields()
        return self

    def _release_fields(self) -> None:
        """What one release's batch holds beyond these."""

    def _extend_lens(self) -> list[int]:
        raise NotImplementedError

    def prepare_for_extend(self) -> None:
        self.extend_lens = self._extend_lens()
        self.req_to_token_pool._take(len(self.reqs))
        self.tree_cache.token_to_kv_pool_allocator._take(sum(self.extend_lens))
        self.prefill_input_ids_cpu = prefill_ids(self.reqs, self.extend_lens)
