"""The `sglang` capture engine: a target that needs a whole node, captured by SGLang's own model
runner in-process, tensor parallel over the torchrun ranks.

Supported releases: 0.5.14 and 0.5.23 (`releases.SUPPORTED_VERSIONS`); any other is
refused before SGLang is imported, naming both and their pip lines. Everything around the capture
seam changes between them, so each has an adapter here (`Runner0514`, `Runner0523`), written
from that release's own scheduler-less driver, its `bench_one_batch`, and checked in CI against
that release's source (tests/sglang_contract: every import, call, keyword and attribute). This
module is the only one of the project that imports SGLang.

What each adapter does, and the release file each step mirrors:

0.5.14 (`sglang/bench_one_batch.py` load_model and extend; `srt/managers/tp_worker.py`):
  1. `ServerArgs(...)`: a dataclass whose `__post_init__` resolves the defaults.
  2. `initialize_moe_config`, `initialize_fp8_gemm_config`, `initialize_fp4_gemm_config`, as
     bench_one_batch's latency_test does before it loads the model.
  3. `ModelConfig.from_server_args`, then `ModelRunner(model_config, mem_fraction_static, gpu_id,
     tp_rank, tp_size, moe_ep_rank, moe_ep_size, pp_rank, pp_size, nccl_port, server_args)`: the
     runner itself initialises the distributed environment (an initialised torchrun group is
     reused: `parallel_state.init_distributed_environment`) and loads the weights.
  4. `alloc_memory_pool()`, `init_attention_backends()`, then the capture ids with
     `model.set_eagle3_layers_to_capture` (as `ModelRunner.init_aux_hidden_state_capture` does
     for an EAGLE-3 draft), then `init_cuda_graphs()`, which builds the eager runner every
     forward goes through even with CUDA graphs off.
  5. Per forward: `Req(rid, "", array("q", ids), SamplingParams)` with `full_untruncated_fill_ids`,
     `fill_len`, `logprob_start_len = -1` and `set_extend_input_len`; `ScheduleBatch.init_new`
     over a tree cache that only allocates; `prepare_for_extend()`; the ids moved to the device
     (`prefill_input_ids_cpu`); `batch.capture_hidden_mode = FULL`; `ForwardBatch.init_new(batch,
     runner)`; `runner.forward`; both pools cleared.
  6. The output's `hidden_states` are the aux layers side by side; 0.5.14's LogitsProcessorOutput
     has no post-norm state beside them, so it is taken as the logits processor's input (a
     forward pre-hook; CUDA graphs are off, so hooks run).

0.5.23 (`sglang/benchmark/one_batch.py` correctness_test, load_model and extend;
`srt/managers/scheduler.py` run_scheduler_process):
  1. `load_plugins()`; `ServerArgs(...)` with `enable_return_aux_hidden_states`,
     `speculative_algorithm="EAGLE3"` and `return_aux_hidden_state_layer_ids` (resolution turns
     that into a capture-only run: no draft is loaded), then `resolve_once()`.
  2. `publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank, gpu_id))`: the runner
     refuses a ServerArgs that was not published (`assert_published`).
  3. `initialize_moe_config`, `initialize_fp8_gemm_config`, `initialize_bf16_gemm_config`,
     `initialize_fp4_gemm_config` (one_batch.py `_init_process_global_configs`).
  4. `ModelConfig.from_server_args`; `bootstrap.init_parallel_runtime` (reuses an initialised
     torchrun group) and `bootstrap.init_layer_runtime`; `ModelRunner(model_config,
     mem_fraction_static, gpu_id, nccl_port, server_args)`.
  5. `alloc_memory_pool()`, `init_attention_backends()` (which sets the capture ids on the model
     from the resolved settings), `init_cuda_graphs()` (the eager runner).
  6. Per forward: as 0.5.14, with the renamed fields (`extend_end` for `fill_len`, no
     `set_extend_input_len`) and `ForwardBatch.init_new(batch, runner, capture_hidden_mode=FULL,
     return_hidden_states_before_norm=False)`.
  7. The output's `hidden_states` are the aux layers and `last_hidden_states` the post-norm
     final state of every token (kept because the run is a capture-only one).

Both: radix cache off, chunked prefill off (`chunked_prefill_size=-1`), pipeline parallel 1,
CUDA graphs off (prefill only), expert parallel `ep_size` (dividing tp_size) with SGLang's default
MoE all-to-all; DP attention and DeepEP are not supported. Samples are packed in order into
forwards of at most `max_tokens_per_forward` tokens (capped by the runner's KV pool) and at most
`max_running_requests` samples; the flat outputs are split back by length. Every TP rank holds
the same captures; only rank 0 writes (`role.writes`).

None of this has run on a GPU with SGLang: the tests drive it with stand-ins of each release
(tests/fake_sglang), themselves held to the releases' signatures. On a node, run the canary
first (`python -m stages.commands.canary`, README: "Moving to GPUs and SGLang").
"""

from __future__ import annotations

import socket
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..drafter.layers import serving_layer_ids, sglang_captured_indices
from ..engines import EngineError
from .interface import Captured, Role, config_facts
from .packing import packed_rows
from .releases import check_sglang_version


class SGLangCaptureError(EngineError):
    """SGLang gave features of the wrong shape, or the run's layout cannot be served."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RunnerSettings:
    """What an adapter needs to build its release's model runner."""

    model_path: str
    layer_ids: tuple[int, ...]  # the ids SGLang is told, for this release and family
    rank: int
    local_rank: int
    tp_size: int
    ep_size: int
    mem_fraction_static: float
    trust_remote_code: bool
    model_dtype: str

    def server_args(self) -> dict[str, Any]:
        """The ServerArgs fields both releases take alike."""
        return dict(
            model_path=self.model_path,
            trust_remote_code=self.trust_remote_code,
            dtype=self.model_dtype,
            tp_size=self.tp_size,
            ep_size=self.ep_size,
            pp_size=1,
            mem_fraction_static=self.mem_fraction_static,
            disable_radix_cache=True,
            chunked_prefill_size=-1,
            disable_cuda_graph=True,
            skip_tokenizer_init=True,
        )


class PrefillOnlyCache:
    """The tree cache a prefill-only batch needs: no prefix is ever shared, so it only hands the
    KV allocator to `prepare_for_extend` and evicts nothing (the release's bench_one_batch runs
    its forwards over the same)."""

    def __init__(self, page_size: int, device: Any, token_to_kv_pool_allocator: Any):
        self.page_size = page_size
        self.device = device
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator

    def supports_swa(self) -> bool:
        return False

    def supports_mamba(self) -> bool:
        return False

    def supports_prefix_sharing(self) -> bool:
        return True

    def is_chunk_cache(self) -> bool:
        return False

    def is_tree_cache(self) -> bool:
        return True

    def evict(self, params: Any) -> None:
        """Nothing is cached, so nothing to evict."""

    def maybe_hand_to_session(self, req: Any) -> None:
        """No sessions."""


class ReleaseRunner:
    """What the adapters share: a prefill-only batch built, moved to the device, run and freed
    the way both releases' bench_one_batch do it. Each adapter builds its runner and says how a
    request is made and how its ScheduleBatch becomes a forward."""

    runner: Any
    page_size: int
    max_requests: int
    max_tokens: int
    _Req: Any  # the release's Req, SamplingParams and ScheduleBatch
    _SamplingParams: Any
    _ScheduleBatch: Any
    _no_speculation: Any  # its SpeculativeAlgorithm.NONE

    def __init__(self, s: RunnerSettings):
        raise NotImplementedError

    def new_request(self, rid: str, ids: Sequence[int]) -> Any:
        """A request of the ids alone, no prefix, no logprobs: what both releases' bench builds
        before it sets the release's own extend fields."""
        req = self._Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", ids),
            sampling_params=self._SamplingParams(temperature=0, max_new_tokens=1),
        )
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        return req

    def request(self, rid: str, ids: Sequence[int]) -> Any:
        raise NotImplementedError

    def forward(self, schedule: Any) -> tuple[Any, Any]:
        """(aux, post-norm final state) of the batch's tokens."""
        raise NotImplementedError

    def prefill(self, batch: list[Sequence[int]], tag: str) -> tuple[Any, Any]:
        runner = self.runner
        schedule = self._ScheduleBatch.init_new(
            reqs=[self.request(f"{tag}-{i}", ids) for i, ids in enumerate(batch)],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            tree_cache=PrefillOnlyCache(
                self.page_size, runner.device, runner.token_to_kv_pool_allocator
            ),
            model_config=runner.model_config,
            enable_overlap=False,
            spec_algorithm=self._no_speculation,
        )
        try:
            schedule.prepare_for_extend()
            schedule.input_ids = schedule.prefill_input_ids_cpu.to(schedule.device)
            schedule.prefill_input_ids_cpu = None
            return self.forward(schedule)
        finally:
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()


class Runner0514(ReleaseRunner):
    """SGLang 0.5.14's model runner, built and driven as its bench_one_batch does."""

    def __init__(self, s: RunnerSettings):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.layers.moe.utils import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self._Req, self._ForwardBatch, self._SamplingParams = Req, ForwardBatch, SamplingParams
        self._ScheduleBatch, self._no_speculation = ScheduleBatch, SpeculativeAlgorithm.NONE
        self._full = CaptureHiddenMode.FULL
        server_args = ServerArgs(**s.server_args())
        initialize_moe_config(server_args)
        initialize_fp8_gemm_config(server_args)
        initialize_fp4_gemm_config(server_args)
        runner = ModelRunner(
            model_config=ModelConfig.from_server_args(server_args),
            mem_fraction_static=server_args.mem_fraction_static,
            gpu_id=s.local_rank,
            tp_rank=s.rank,
            tp_size=s.tp_size,
            moe_ep_rank=s.rank // (s.tp_size // s.ep_size),
            moe_ep_size=s.ep_size,
            pp_rank=0,
            pp_size=1,
            nccl_port=_free_port(),
            server_args=server_args,
        )
        runner.alloc_memory_pool()
        runner.init_attention_backends()
        runner.model.set_eagle3_layers_to_capture(list(s.layer_ids))
        runner.init_cuda_graphs()
        self._final: torch.Tensor | None = None
        runner.model.logits_processor.register_forward_pre_hook(self._keep_final)
        self.runner, self.page_size = runner, server_args.page_size
        self.max_requests = int(runner.max_running_requests)
        self.max_tokens = int(runner.max_total_num_tokens)

    def _keep_final(self, _module: Any, args: tuple) -> None:
        """The logits processor's input (input_ids, hidden_states, ...) is the post-norm state."""
        self._final = args[1]

    def request(self, rid: str, ids: Sequence[int]) -> Any:
        req = self.new_request(rid, ids)
        req.fill_len = len(req.full_untruncated_fill_ids)
        req.set_extend_input_len(req.fill_len - len(req.prefix_indices))
        return req

    def forward(self, schedule: Any) -> tuple[Any, Any]:
        self._final = None
        schedule.capture_hidden_mode = self._full
        output = self.runner.forward(self._ForwardBatch.init_new(schedule, self.runner))
        return output.logits_output.hidden_states, self._final


def _initialize_kernel_configs() -> None:
    """The process-wide MoE and GEMM settings 0.5.23's scheduler sets from the published server
    args before it builds a model runner; the layers read them while loading."""
    from sglang.srt.layers.moe import initialize_moe_config
    from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
    from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
    from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config

    initialize_moe_config()
    initialize_fp8_gemm_config()
    initialize_bf16_gemm_config()
    initialize_fp4_gemm_config()


class Runner0523(ReleaseRunner):
    """SGLang 0.5.23's model runner, built and driven as its benchmark/one_batch.py does, with
    the capture-only settings of --enable-return-aux-hidden-states."""

    def __init__(self, s: RunnerSettings):
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed import bootstrap
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.plugins import load_plugins
        from sglang.srt.runtime_context import (
            SpawnRanks,
            get_device,
            get_schedule,
            publish,
            spawn_world_rank,
        )
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self._Req, self._ForwardBatch, self._SamplingParams = Req, ForwardBatch, SamplingParams
        self._ScheduleBatch, self._no_speculation = ScheduleBatch, SpeculativeAlgorithm.NONE
        self._full = CaptureHiddenMode.FULL
        load_plugins()
        server_args = ServerArgs(
            **s.server_args(),
            enable_return_aux_hidden_states=True,
            speculative_algorithm="EAGLE3",
            return_aux_hidden_state_layer_ids=list(s.layer_ids),
        )
        server_args.resolve_once()
        world_rank = spawn_world_rank(server_args, tp_rank=s.rank, pp_rank=0)
        publish(
            server_args,
            role="scheduler",
            ranks=SpawnRanks(world_rank=world_rank, gpu_id=s.local_rank),
        )
        _initialize_kernel_configs()
        model_config = ModelConfig.from_server_args(server_args)
        port = _free_port()
        bootstrap.init_parallel_runtime(
            server_args=server_args, device=get_device().device, dist_port=port
        )
        bootstrap.init_layer_runtime(model_config=model_config)
        runner = ModelRunner(
            model_config=model_config,
            mem_fraction_static=get_schedule().mem_fraction_static,
            gpu_id=s.local_rank,
            nccl_port=port,
            server_args=server_args,
        )
        runner.alloc_memory_pool()
        runner.init_attention_backends()
        runner.init_cuda_graphs()
        self.runner, self.page_size = runner, get_schedule().page_size
        self.max_requests = int(runner.max_running_requests)
        self.max_tokens = int(runner.max_total_num_tokens)

    def request(self, rid: str, ids: Sequence[int]) -> Any:
        req = self.new_request(rid, ids)
        req.extend_end = len(req.full_untruncated_fill_ids)
        return req

    def forward(self, schedule: Any) -> tuple[Any, Any]:
        forward_batch = self._ForwardBatch.init_new(
            schedule,
            self.runner,
            capture_hidden_mode=self._full,
            return_hidden_states_before_norm=False,
        )
        output = self.runner.forward(forward_batch).logits_output
        return output.hidden_states, output.last_hidden_states


RUNNERS: dict[str, type[ReleaseRunner]] = {
    "0.5.14": Runner0514,
    "0.5.23": Runner0523,
}


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
        # the ids that make this release capture exactly HF hidden_states[aux_indices]
        arch, layers = self.architecture, self.num_layers
        self.layer_ids = serving_layer_ids(arch, self.aux_indices, layers, self.version)["sglang"]
        captured = sglang_captured_indices(arch, self.layer_ids, layers, self.version)
        if captured != self.aux_indices:  # serving_layer_ids only returns ids that pass this
            raise SGLangCaptureError(f"ids {self.layer_ids} would capture {captured}")
        settings = RunnerSettings(
            model_path=model_path,
            layer_ids=tuple(self.layer_ids),
            rank=rank,
            local_rank=local_rank,
            tp_size=tp_size,
            ep_size=ep_size,
            mem_fraction_static=mem_fraction_static,
            trust_remote_code=trust_remote_code,
            model_dtype=model_dtype,
        )
        self.runner = RUNNERS[self.version](settings)
        self.max_tokens = min(max_tokens_per_forward, self.runner.max_tokens)
        self._forwards = 0

    def max_samples(self) -> int | None:
        """Requests one forward may hold: the runner's max_running_requests."""
        return self.runner.max_requests or None

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
        aux, last = self.runner.prefill(batch, f"capture-{self._forwards}")
        self._forwards += 1
        total = sum(len(ids) for ids in batch)
        width = len(self.aux_indices) * self.hidden_size
        if aux is None or tuple(aux.shape) != (total, width):
            raise SGLangCaptureError(
                f"SGLang {self.version} returned hidden_states of shape "
                f"{None if aux is None else tuple(aux.shape)} for {total} tokens; expected "
                f"({total}, {width}): the aux layers {self.aux_indices} (ids {self.layer_ids}) "
                f"of every token"
            )
        if last is None or tuple(last.shape) != (total, self.hidden_size):
            raise SGLangCaptureError(
                f"SGLang {self.version}: the post-norm final state is "
                f"{None if last is None else tuple(last.shape)}, expected ({total}, "
                f"{self.hidden_size})"
            )
        return aux.to(self.dtype), last.to(self.dtype)
