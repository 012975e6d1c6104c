"""The `sglang` capture engine: a target that needs a whole node, captured by SGLang's own model
runner in-process, tensor parallel over the torchrun ranks.

Written against SGLang 0.5.23 (`SUPPORTED_VERSIONS`); it refuses any other installed version
before touching SGLang, naming the version and the pip line, because everything around the
capture seam changes between releases (how a ModelRunner is built and its pools allocated, how a
ScheduleBatch becomes a ForwardBatch, the parallel_state wiring). This module holds every SGLang
import and call of the project's extraction; the SGLang symbols it uses, all imported inside
`SGLangCapture.__init__` after the version check:

    sglang.srt.server_args.ServerArgs
    sglang.srt.configs.model_config.ModelConfig                 (.from_server_args)
    sglang.srt.model_executor.model_runner.ModelRunner          (.alloc_memory_pool, .init_backends
                                                                  or .init_attention_backends +
                                                                  .init_cuda_graphs, .forward,
                                                                  .model, .req_to_token_pool,
                                                                  .token_to_kv_pool_allocator)
    sglang.srt.model_executor.forward_batch_info.ForwardBatch   (.init_new, .capture_hidden_mode)
    sglang.srt.model_executor.forward_batch_info.CaptureHiddenMode   (.FULL)
    sglang.srt.managers.schedule_batch.Req, ScheduleBatch       (.init_new, .prepare_for_extend,
                                                                  .get_model_worker_batch)
    sglang.srt.sampling.sampling_params.SamplingParams
    sglang.srt.mem_cache.cache_init_params.CacheInitParams
    sglang.srt.mem_cache.radix_cache.RadixCache                 (disabled: nothing is cached)
    sglang.srt.speculative.spec_info.SpeculativeAlgorithm       (.NONE)

and on the model: `set_eagle3_layers_to_capture(ids)`; on the forward's logits-processor output:
`hidden_states` (the aux layers side by side, [tokens, num_aux * H]) and `last_hidden_states`
(the post-norm final state, [tokens, H]). Where an output carries no usable
`last_hidden_states`, the post-norm state is read as the input of the model's logits processor
(a forward pre-hook), which is the same tensor.

How it runs (docs/serving.md section 5):
- `torchrun --nproc-per-node <tp_size>`: every process is one TP rank of one model; this module
  does not start processes. The stage has already joined torchrun's process group (NCCL), so
  SGLang's `init_distributed_environment` finds it initialised and builds its world and TP
  groups on those ranks; with one process SGLang initialises its own on a free local port.
- radix cache off (a cached prefix would not be recomputed, its states missing), chunked prefill
  off (`chunked_prefill_size=-1`: each sequence in one forward), pipeline parallel 1, CUDA graphs
  off (prefill only). Expert parallel is `ep_size` (dividing tp_size) with SGLang's default MoE
  all-to-all; DP attention and DeepEP, which need SGLang's MLP-sync step, are not supported.
- ids: `stages/drafter/layers.py` turns the recorded HF indices into the ids that make the
  installed SGLang version capture exactly them for this model family (CAPTURE_TABLE), and the
  engine checks the width of what comes back.
- batches: samples packed in order into forwards of at most `max_tokens_per_forward` tokens (a
  longer sample runs alone) and at most as many as the request pool holds; the flat
  [total_tokens, ...] outputs are split back into samples by their input lengths.
- every TP rank ends up holding the same captures; only TP rank 0 writes (`role.writes`).

Nothing here has run against a real SGLang: the tests drive it with a stand-in package of exactly
these symbols (tests/fake_sglang), and `python -m stages.canary` is the check to run first on a
node.
"""

from __future__ import annotations

import importlib.metadata
import socket
from collections.abc import Iterator, Sequence

import torch

from ..drafter.layers import parse_version, serving_layer_ids, sglang_captured_indices
from ..target.capture import Captured, Role, config_facts
from ..target.packing import packed_rows
from . import EngineError

SUPPORTED_VERSIONS = ("0.5.23",)
PIP_LINE = f'pip install "sglang=={SUPPORTED_VERSIONS[-1]}"'


class SGLangCaptureError(EngineError):
    """SGLang is missing, of another version, or gave features of the wrong shape."""


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str:
    """The installed SGLang version, if it is one this engine is written against; else an error
    naming the supported versions and the pip line."""
    version = installed_sglang_version() if version is None else version
    supported = ", ".join(SUPPORTED_VERSIONS)
    if version is None:
        raise SGLangCaptureError(
            f"extract.engine sglang needs SGLang {supported}, which is not installed: {PIP_LINE}"
        )
    if not any(parse_version(version) == parse_version(v) for v in SUPPORTED_VERSIONS):
        raise SGLangCaptureError(
            f"extract.engine sglang is written against SGLang {supported}; {version} is "
            f"installed, and the model-runner API around the capture changes between releases. "
            f"Install the supported one: {PIP_LINE}"
        )
    return version


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SGLangCapture:
    """The Capture of a target run by SGLang's ModelRunner as one TP group of `tp_size` ranks."""

    def __init__(
        self,
        model_path: str,
        aux_indices: list[int],
        dtype: torch.dtype,
        *,
        rank: int,
        world: int,
        local_rank: int,
        tp_size: int,
        ep_size: int = 1,
        mem_fraction_static: float = 0.85,
        max_tokens_per_forward: int = 32768,
        trust_remote_code: bool = False,
        model_dtype: str = "auto",
    ):
        self.version = check_sglang_version()
        if world != tp_size:
            raise SGLangCaptureError(
                f"tp_size is {tp_size} but {world} process(es) run: start exactly tp_size "
                f"ranks (torchrun --nproc-per-node {tp_size}); pipeline parallel and several "
                f"TP groups are not supported"
            )
        if tp_size % ep_size:
            raise SGLangCaptureError(f"ep_size {ep_size} does not divide tp_size {tp_size}")
        # the Capture properties
        self.architecture, self.num_layers, self.hidden_size = config_facts(model_path)
        self.aux_indices = [int(i) for i in aux_indices]
        self.dtype = dtype
        self.role = Role(0, 1, writes=rank == 0)
        # the ids that make this SGLang version capture exactly HF hidden_states[aux_indices]
        arch, layers = self.architecture, self.num_layers
        self.layer_ids = serving_layer_ids(arch, self.aux_indices, layers, self.version)["sglang"]
        captured = sglang_captured_indices(arch, self.layer_ids, layers, self.version)
        if captured != self.aux_indices:  # serving_layer_ids only returns ids that pass this
            raise SGLangCaptureError(f"ids {self.layer_ids} would capture {captured}")
        self.max_tokens = max_tokens_per_forward

        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self._sg = dict(
            Req=Req,
            ScheduleBatch=ScheduleBatch,
            CacheInitParams=CacheInitParams,
            RadixCache=RadixCache,
            CaptureHiddenMode=CaptureHiddenMode,
            ForwardBatch=ForwardBatch,
            SamplingParams=SamplingParams,
            SpeculativeAlgorithm=SpeculativeAlgorithm,
        )
        self.server_args = ServerArgs(
            model_path=model_path,
            trust_remote_code=trust_remote_code,
            dtype=model_dtype,
            tp_size=tp_size,
            ep_size=ep_size,
            pp_size=1,
            mem_fraction_static=mem_fraction_static,
            disable_radix_cache=True,
            chunked_prefill_size=-1,
            disable_cuda_graph=True,
            skip_tokenizer_init=True,
        )
        model_config = ModelConfig.from_server_args(self.server_args)
        self.runner = ModelRunner(
            model_config=model_config,
            mem_fraction_static=mem_fraction_static,
            gpu_id=local_rank,
            tp_rank=rank,
            tp_size=tp_size,
            moe_ep_rank=rank // (tp_size // ep_size),
            moe_ep_size=ep_size,
            pp_rank=0,
            pp_size=1,
            nccl_port=_free_port(),
            server_args=self.server_args,
        )
        # Since 0.5.14 the KV pools, attention backends and graphs are set up by the caller.
        if getattr(self.runner, "req_to_token_pool", None) is None:
            self.runner.alloc_memory_pool()
        if getattr(self.runner, "attn_backend", None) is None:
            if hasattr(self.runner, "init_backends"):
                self.runner.init_backends(disable_cuda_graph=True)
            else:
                self.runner.init_attention_backends()
                self.runner.init_cuda_graphs()
        self.runner.model.set_eagle3_layers_to_capture(list(self.layer_ids))
        self._final: torch.Tensor | None = None
        self._hook_final_state()
        self._forwards = 0

    # --- capture ---------------------------------------------------------------------------

    def max_samples(self) -> int | None:
        """Requests one forward may hold: the runner's request-to-token pool."""
        size = getattr(self.runner.req_to_token_pool, "size", None)
        return int(size) if size else None

    def capture(self, input_ids: Sequence[Sequence[int]]) -> Iterator[Captured]:
        lengths = [len(ids) for ids in input_ids]
        for batch in packed_rows(lengths, self.max_tokens, self.max_samples()):
            aux, last = self._forward([input_ids[p] for p in batch])
            sizes = [lengths[p] for p in batch]
            yield from zip(batch, aux.split(sizes), last.split(sizes))

    @torch.inference_mode()
    def _forward(self, batch: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One prefill-only forward of `batch`: (aux [total, num_aux * H], last [total, H]) in
        the stored dtype, the samples' tokens one after another."""
        sg, runner = self._sg, self.runner
        params = sg["SamplingParams"](temperature=0, max_new_tokens=1)
        reqs = []
        for i, ids in enumerate(batch):
            req = sg["Req"](
                rid=f"capture-{self._forwards}-{i}",
                origin_input_text="",
                origin_input_ids=list(ids),
                sampling_params=params,
            )
            req.fill_ids = req.origin_input_ids
            req.extend_input_len = len(req.fill_ids)
            req.logprob_start_len = len(req.fill_ids) - 1
            reqs.append(req)
        self._forwards += 1
        tree_cache = sg["RadixCache"](
            sg["CacheInitParams"](
                disable=True,
                req_to_token_pool=runner.req_to_token_pool,
                token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
                page_size=self.server_args.page_size,
            )
        )
        schedule = sg["ScheduleBatch"].init_new(
            reqs=reqs,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            tree_cache=tree_cache,
            model_config=runner.model_config,
            enable_overlap=False,
            spec_algorithm=sg["SpeculativeAlgorithm"].NONE,
        )
        schedule.prepare_for_extend()
        forward_batch = sg["ForwardBatch"].init_new(schedule.get_model_worker_batch(), runner)
        forward_batch.capture_hidden_mode = sg["CaptureHiddenMode"].FULL
        self._final = None
        try:
            output = runner.forward(forward_batch)
        finally:
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()
        logits_output = getattr(output, "logits_output", output)
        total = sum(len(ids) for ids in batch)
        aux = getattr(logits_output, "hidden_states", None)
        width = len(self.aux_indices) * self.hidden_size
        if aux is None or tuple(aux.shape) != (total, width):
            raise SGLangCaptureError(
                f"SGLang {self.version} returned hidden_states of shape "
                f"{None if aux is None else tuple(aux.shape)} for {total} tokens; expected "
                f"({total}, {width}): the aux layers {self.aux_indices} (ids {self.layer_ids}) "
                f"of every token. Is the radix cache or chunked prefill on, or the capture mode "
                f"not FULL?"
            )
        last = getattr(logits_output, "last_hidden_states", None)
        if last is None or tuple(last.shape) != (total, self.hidden_size):
            last = self._final
        if last is None or tuple(last.shape) != (total, self.hidden_size):
            raise SGLangCaptureError(
                f"SGLang {self.version}: no post-norm final state of shape ({total}, "
                f"{self.hidden_size}) in the forward's output nor at its logits processor"
            )
        return aux.to(self.dtype), last.to(self.dtype)

    def _hook_final_state(self) -> None:
        """Keep the input of the model's logits processor: the post-norm state of every token."""
        for name, module in self.runner.model.named_modules():
            if name.split(".")[-1] == "logits_processor":

                def hook(_module, args, kwargs):
                    states = args[1] if len(args) > 1 else kwargs.get("hidden_states")
                    self._final = states

                module.register_forward_pre_hook(hook, with_kwargs=True)
                return
