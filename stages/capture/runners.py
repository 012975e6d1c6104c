"""SGLang's model runner built and driven for a prefill-only capture, one adapter per release.

Every release from 0.5.14 to 0.5.23 builds its runner the way its own scheduler-less driver does
(`sglang/bench_one_batch.py` in 0.5.14, `sglang/benchmark/one_batch.py` from 0.5.15: load_model,
latency_test and extend), and each adapter is that driver's steps for its release, checked in CI
against the release's own source (tests/sglang_contract: every import, call, keyword and
attribute). Together with capture/sglang_runner.py this is the only module of the project that
imports SGLang. The template is `ReleaseRunner.__init__`; the steps change where the releases do:

What changes, and where:

- the runner's ranks: ModelRunner keywords (0.5.14-0.5.15); a ParallelState (0.5.16-0.5.20,
  with attention's decode-context-parallel rank from 0.5.18); SGLang's bootstrap after
  `publish(..., ranks=SpawnRanks(...))` (0.5.21-0.5.23).
- ServerArgs: resolved in `__post_init__` (to 0.5.18); by `resolve_once()` and published, the
  runner refusing unpublished ones (0.5.19 on), read through `resolving_view` for the ranks and
  the pool (0.5.19-0.5.20, as their driver reads them); the aux-hidden-states switch (0.5.23).
- kernel configs: the MoE, FP8 and FP4 initialisers take the server args (to 0.5.18), read the
  published ones (0.5.19 on), with BF16's beside them (0.5.22 on).
- a request's extent: `fill_len` (0.5.14), `set_extend_range` (0.5.15-0.5.21), `extend_end`.
- the capture mode: on the ScheduleBatch (to 0.5.15), a ForwardBatch.init_new keyword after.
- capture ids and final state: `set_eagle3_layers_to_capture` and the logits processor's input
  (to 0.5.22; a multimodal wrapper's, Kimi-K2.5's, is its language model's); the switch's
  resolved settings and `last_hidden_states` (0.5.23).

The releases group by how the runner gets its ranks (the model-runner API): keywords of
`ModelRunner` (`RanksRunner`, 0.5.14-0.5.15), a `ParallelState` (`ParallelStateRunner`,
0.5.16-0.5.20), SGLang's own `bootstrap` after `publish` (`BootstrapRunner`, 0.5.21-0.5.23).

Both: radix cache off, chunked prefill off (`chunked_prefill_size=-1`), pipeline parallel 1,
CUDA graphs off (prefill only), expert parallel `ep_size` (dividing tp_size) with SGLang's default
MoE all-to-all; DP attention and DeepEP are not supported.
"""

from __future__ import annotations

import socket
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def free_port() -> int:
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
        """The ServerArgs fields every release takes alike."""
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

    @property
    def moe_ep_rank(self) -> int:
        return self.rank // (self.tp_size // self.ep_size)


@dataclass(frozen=True)
class NothingEvicted:
    """What an eviction freed (SGLang's EvictResult fields, which the releases that read it
    read): nothing, since nothing is cached."""

    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


class PrefillOnlyCache:
    """The tree cache a prefill-only batch needs: no prefix is ever shared, so it only hands the
    KV allocator to `prepare_for_extend` and evicts nothing (the releases' drivers run their
    forwards over the same). It has every method of the releases' `BasePrefixCache` that their
    prefill path and its out-of-memory path call (tests/sglang_contract/tree_cache.py), so a
    full pool ends in SGLang's own message."""

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

    def evict(self, params: Any) -> NothingEvicted:
        """Nothing is cached, so nothing to evict."""
        return NothingEvicted()

    def evict_for_alloc(
        self, params: Any, *, allocation_reclaim_satisfied: Any = None
    ) -> NothingEvicted:
        """0.5.19 on, before an allocation the pool cannot hold: nothing to free."""
        return NothingEvicted()

    def available_and_evictable_str(self) -> str:
        """The out-of-memory message's line: the allocator's free tokens, none evictable."""
        available = self.token_to_kv_pool_allocator.available_size()
        return f"Available tokens: {available} ({available=} + evictable_size=0)\n"

    def pretty_print(self) -> None:
        """The out-of-memory path prints the tree: there is none."""

    def rotation_base_of(self, node: Any) -> None:
        """Sharded pages: no chain holds a base here (a request without a prefix starts one)."""
        return None

    def prefix_device_indices(self, req: Any) -> Any:
        """Only a request with a cached prefix asks; none has one here."""
        raise RuntimeError(
            f"request {req.rid}: a prefill-only capture caches no prefix, yet it has "
            f"{req.prefix_len} prefix tokens"
        )

    def maybe_hand_to_session(self, req: Any) -> None:
        """No sessions."""


class ReleaseRunner:
    """The template every release follows: server args, process-wide settings, the runner, its
    memory pools and attention backends, the capture ids, the eager runner; then per forward a
    prefill-only batch built, moved to the device, run and freed. Each step that differs between
    releases is a method of the group or step classes below."""

    runner: Any
    server_args: Any
    page_size: int

    def __init__(self, s: RunnerSettings):
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self._Req, self._ForwardBatch, self._SamplingParams = Req, ForwardBatch, SamplingParams
        self._ScheduleBatch, self._no_speculation = ScheduleBatch, SpeculativeAlgorithm.NONE
        self._full = CaptureHiddenMode.FULL
        self.make_server_args(s)
        self.init_process(s)
        self.make_runner(s)
        self.runner.alloc_memory_pool()
        self.runner.init_attention_backends()
        self.set_capture(s)
        self.runner.init_cuda_graphs()  # the eager runner every forward goes through
        self.max_requests = int(self.runner.max_running_requests)
        self.max_tokens = int(self.runner.max_total_num_tokens)

    # the steps each group or release says how to do
    def make_server_args(self, s: RunnerSettings) -> None:
        raise NotImplementedError

    def init_process(self, s: RunnerSettings) -> None:
        raise NotImplementedError

    def make_runner(self, s: RunnerSettings) -> None:
        raise NotImplementedError

    def set_capture(self, s: RunnerSettings) -> None:
        raise NotImplementedError

    def set_extend(self, req: Any) -> None:
        raise NotImplementedError

    def forward_batch(self, schedule: Any) -> Any:
        """The ForwardBatch of a prepared ScheduleBatch, capturing every token's aux layers."""
        raise NotImplementedError

    def forward(self, schedule: Any) -> tuple[Any, Any]:
        """(aux, post-norm final state) of the batch's tokens."""
        raise NotImplementedError

    def request(self, rid: str, ids: Sequence[int]) -> Any:
        """A request of the ids alone, no prefix, no logprobs, extended over all of them."""
        req = self._Req(
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", ids),
            sampling_params=self._SamplingParams(temperature=0, max_new_tokens=1),
        )
        req.full_untruncated_fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        self.set_extend(req)
        return req

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


# --- how a release's runner gets its ranks: the three model-runner APIs -----------------------


class RanksRunner(ReleaseRunner):
    """0.5.14-0.5.15: ModelRunner takes the tp / ep / pp ranks as keywords and initialises the
    distributed environment itself (an initialised torchrun group is reused); the capture mode
    is set on the ScheduleBatch, and ServerArgs resolves itself in `__post_init__`."""

    def make_server_args(self, s: RunnerSettings) -> None:
        from sglang.srt.server_args import ServerArgs

        self.server_args = ServerArgs(**s.server_args())
        self.page_size = self.server_args.page_size

    def make_runner(self, s: RunnerSettings) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.runner = ModelRunner(
            model_config=ModelConfig.from_server_args(self.server_args),
            mem_fraction_static=self.server_args.mem_fraction_static,
            gpu_id=s.local_rank,
            tp_rank=s.rank,
            tp_size=s.tp_size,
            moe_ep_rank=s.moe_ep_rank,
            moe_ep_size=s.ep_size,
            pp_rank=0,
            pp_size=1,
            nccl_port=free_port(),
            server_args=self.server_args,
        )

    def forward_batch(self, schedule: Any) -> Any:
        schedule.capture_hidden_mode = self._full
        return self._ForwardBatch.init_new(schedule, self.runner)


class CaptureModeKeyword:
    """0.5.16 on: the capture mode is a keyword of ForwardBatch.init_new."""

    _ForwardBatch: Any
    _full: Any
    runner: Any

    def forward_batch(self, schedule: Any) -> Any:
        return self._ForwardBatch.init_new(
            schedule,
            self.runner,
            capture_hidden_mode=self._full,
            return_hidden_states_before_norm=False,
        )


class ParallelStateRunner(CaptureModeKeyword, ReleaseRunner):
    """0.5.16-0.5.20: ModelRunner takes a `ParallelState` (`ps`) that the driver computes from
    the ranks."""

    def parallel_state(self, s: RunnerSettings) -> Any:
        raise NotImplementedError

    def settings(self) -> Any:
        """The server args as the release's driver reads them for the ranks and the pool."""
        return self.server_args

    def attention_ranks(self, s: RunnerSettings) -> tuple[int, int, int, int]:
        """(attention tp rank and size, dp rank and size), as the driver's load_model has them."""
        from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

        args = self.settings()
        return compute_dp_attention_world_info(
            args.enable_dp_attention, s.rank, args.tp_size, args.dp_size, args.attn_cp_size
        )

    def make_runner(self, s: RunnerSettings) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.runner = ModelRunner(
            model_config=ModelConfig.from_server_args(self.server_args),
            mem_fraction_static=self.settings().mem_fraction_static,
            gpu_id=s.local_rank,
            ps=self.parallel_state(s),
            nccl_port=free_port(),
            server_args=self.server_args,
        )


class BootstrapRunner(CaptureModeKeyword, ReleaseRunner):
    """0.5.21-0.5.23: the ranks come from the published ServerArgs (`publish` with
    `SpawnRanks`); SGLang's `bootstrap` sets up the parallel groups (reusing an initialised
    torchrun group) and the layer runtime before the runner, which takes no ranks."""

    def init_process(self, s: RunnerSettings) -> None:
        from sglang.srt.runtime_context import SpawnRanks, publish, spawn_world_rank

        world_rank = spawn_world_rank(self.server_args, tp_rank=s.rank, pp_rank=0)
        publish(
            self.server_args,
            role="scheduler",
            ranks=SpawnRanks(world_rank=world_rank, gpu_id=s.local_rank),
        )
        self.init_kernel_configs()

    def init_kernel_configs(self) -> None:
        raise NotImplementedError

    def make_runner(self, s: RunnerSettings) -> None:
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.distributed import bootstrap
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.runtime_context import get_device, get_schedule

        model_config = ModelConfig.from_server_args(self.server_args)
        port = free_port()
        bootstrap.init_parallel_runtime(
            server_args=self.server_args, device=get_device().device, dist_port=port
        )
        bootstrap.init_layer_runtime(model_config=model_config)
        self.runner = ModelRunner(
            model_config=model_config,
            mem_fraction_static=get_schedule().mem_fraction_static,
            gpu_id=s.local_rank,
            nccl_port=port,
            server_args=self.server_args,
        )
        self.page_size = get_schedule().page_size


# --- the steps that change inside a group ------------------------------------------------------


class FillLen:
    """0.5.14: a request's extent is `fill_len` and `set_extend_input_len`."""

    def set_extend(self, req: Any) -> None:
        req.fill_len = len(req.full_untruncated_fill_ids)
        req.set_extend_input_len(req.fill_len - len(req.prefix_indices))


class ExtendRange:
    """0.5.15-0.5.21: `set_extend_range(start, end)`."""

    def set_extend(self, req: Any) -> None:
        req.set_extend_range(len(req.prefix_indices), len(req.full_untruncated_fill_ids))


class ExtendEnd:
    """0.5.22-0.5.23: the extent's end is the field `extend_end`."""

    def set_extend(self, req: Any) -> None:
        req.extend_end = len(req.full_untruncated_fill_ids)


class KernelConfigsOfServerArgs:
    """0.5.14-0.5.18: the MoE and GEMM settings read from the server args, set before the model
    loads (the driver's latency_test does it first)."""

    server_args: Any

    def init_process(self, s: RunnerSettings) -> None:
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config

        initialize_moe_config(self.server_args)
        initialize_fp8_gemm_config(self.server_args)
        initialize_fp4_gemm_config(self.server_args)


class PlainServerArgs:
    """0.5.16-0.5.18: ServerArgs resolves itself in `__post_init__`."""

    server_args: Any
    page_size: int

    def make_server_args(self, s: RunnerSettings) -> None:
        from sglang.srt.server_args import ServerArgs

        self.server_args = ServerArgs(**s.server_args())
        self.page_size = self.server_args.page_size


class PublishedServerArgs:
    """0.5.19-0.5.20: ServerArgs is resolved by `resolve_once()` and published (the runner
    refuses unpublished ones); the MoE and GEMM settings read the published values."""

    server_args: Any
    page_size: int

    def make_server_args(self, s: RunnerSettings) -> None:
        from sglang.srt.runtime_context import get_schedule, publish
        from sglang.srt.server_args import ServerArgs

        self.server_args = ServerArgs(**s.server_args())
        self.server_args.resolve_once()
        publish(self.server_args, role="scheduler")
        self.page_size = get_schedule().page_size

    def init_process(self, s: RunnerSettings) -> None:
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config

        initialize_moe_config()
        initialize_fp8_gemm_config()
        initialize_fp4_gemm_config()

    def settings(self) -> Any:
        """Read as the driver reads them, through `resolving_view`, so that a value a
        model-specific override declared during resolution is seen (the fields keep the raw
        input)."""
        from sglang.srt.arg_groups.overrides import resolving_view

        return resolving_view(self.server_args)


class DcpSize:
    """0.5.16-0.5.17: the ParallelState of the driver's load_model, decode context parallel as
    one size."""

    settings: Callable[[], Any]  # the group's
    attention_ranks: Callable[[RunnerSettings], tuple[int, int, int, int]]  # the group's

    def parallel_state(self, s: RunnerSettings) -> Any:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState

        args = self.settings()
        attn_tp_rank, attn_tp_size, attn_dp_rank, attn_dp_size = self.attention_ranks(s)
        return ParallelState(
            tp_rank=s.rank,
            tp_size=args.tp_size,
            pp_rank=0,
            pp_size=1,
            dp_rank=None,
            dp_size=args.dp_size,
            attn_tp_rank=attn_tp_rank,
            attn_tp_size=attn_tp_size,
            attn_cp_rank=0,
            attn_cp_size=args.attn_cp_size,
            attn_dp_rank=attn_dp_rank,
            attn_dp_size=attn_dp_size,
            moe_ep_rank=s.moe_ep_rank,
            moe_ep_size=args.ep_size,
            moe_dp_rank=None,
            moe_dp_size=args.moe_dp_size,
            dcp_size=args.dcp_size,
            gpu_id=s.local_rank,
        )


class DcpRanks:
    """0.5.18-0.5.20: the same with the decode-context-parallel rank and size of attention."""

    settings: Callable[[], Any]  # the group's
    attention_ranks: Callable[[RunnerSettings], tuple[int, int, int, int]]  # the group's

    def parallel_state(self, s: RunnerSettings) -> Any:
        from sglang.srt.distributed.parallel_state_wrapper import ParallelState

        args = self.settings()
        attn_tp_rank, attn_tp_size, attn_dp_rank, attn_dp_size = self.attention_ranks(s)
        return ParallelState(
            tp_rank=s.rank,
            tp_size=args.tp_size,
            pp_rank=0,
            pp_size=1,
            dp_rank=None,
            dp_size=args.dp_size,
            attn_tp_rank=attn_tp_rank,
            attn_tp_size=attn_tp_size,
            attn_cp_rank=0,
            attn_cp_size=args.attn_cp_size,
            attn_dcp_rank=s.rank % args.dcp_size,
            attn_dcp_size=args.dcp_size,
            attn_dp_rank=attn_dp_rank,
            attn_dp_size=attn_dp_size,
            moe_ep_rank=s.moe_ep_rank,
            moe_ep_size=args.ep_size,
            moe_dp_rank=None,
            moe_dp_size=args.moe_dp_size,
            gpu_id=s.local_rank,
        )


class ResolvedServerArgs:
    """0.5.21-0.5.22: ServerArgs resolved by `resolve_once()` (published by BootstrapRunner)."""

    server_args: Any

    def make_server_args(self, s: RunnerSettings) -> None:
        from sglang.srt.server_args import ServerArgs

        self.server_args = ServerArgs(**s.server_args())
        self.server_args.resolve_once()


class ThreeKernelConfigs:
    """0.5.21: the MoE, FP8 and FP4 settings from the published values, as its driver sets."""

    def init_kernel_configs(self) -> None:
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config

        initialize_moe_config()
        initialize_fp8_gemm_config()
        initialize_fp4_gemm_config()


class FourKernelConfigs:
    """0.5.22-0.5.23: the driver's `_init_process_global_configs`, BF16 GEMM settings too."""

    def init_kernel_configs(self) -> None:
        from sglang.srt.layers.moe import initialize_moe_config
        from sglang.srt.layers.quantization.fp4_utils import initialize_fp4_gemm_config
        from sglang.srt.layers.quantization.fp8_utils import initialize_fp8_gemm_config
        from sglang.srt.layers.quantization.unquant import initialize_bf16_gemm_config

        initialize_moe_config()
        initialize_fp8_gemm_config()
        initialize_bf16_gemm_config()
        initialize_fp4_gemm_config()


class HookedFinalState:
    """0.5.14-0.5.22: the capture ids set on the model (as `init_aux_hidden_state_capture` does
    for an EAGLE-3 draft) and the post-norm state taken as the logits processor's input (a
    forward pre-hook; CUDA graphs are off, so hooks run)."""

    runner: Any
    _final: torch.Tensor | None
    forward_batch: Callable[[Any], Any]  # the group's

    def keep_final(self, _module: Any, args: tuple) -> None:
        """The logits processor's input (input_ids, hidden_states, ...) is the post-norm state."""
        self._final = args[1]

    def language_model(self) -> Any:
        """The model whose logits processor takes the post-norm state: the runner's model, or
        the language model a multimodal wrapper holds (Kimi-K2.5's
        KimiK25ForConditionalGeneration has no logits processor of its own; it forwards the
        capture ids to its language model)."""
        model = self.runner.model
        return model if hasattr(model, "logits_processor") else model.language_model

    def set_capture(self, s: RunnerSettings) -> None:
        self.runner.model.set_eagle3_layers_to_capture(list(s.layer_ids))
        self.language_model().logits_processor.register_forward_pre_hook(self.keep_final)

    def forward(self, schedule: Any) -> tuple[Any, Any]:
        self._final = None
        output = self.runner.forward(self.forward_batch(schedule)).logits_output
        return output.hidden_states, self._final


# --- the adapters ------------------------------------------------------------------------------


class Runner0514(FillLen, KernelConfigsOfServerArgs, HookedFinalState, RanksRunner):
    """SGLang 0.5.14, as its bench_one_batch."""


class Runner0515(ExtendRange, KernelConfigsOfServerArgs, HookedFinalState, RanksRunner):
    """SGLang 0.5.15, as its benchmark/one_batch.py."""


class Runner0516(
    ExtendRange,
    PlainServerArgs,
    KernelConfigsOfServerArgs,
    DcpSize,
    HookedFinalState,
    ParallelStateRunner,
):
    """SGLang 0.5.16 and 0.5.17."""


class Runner0518(
    ExtendRange,
    PlainServerArgs,
    KernelConfigsOfServerArgs,
    DcpRanks,
    HookedFinalState,
    ParallelStateRunner,
):
    """SGLang 0.5.18."""


class Runner0519(ExtendRange, PublishedServerArgs, DcpRanks, HookedFinalState, ParallelStateRunner):
    """SGLang 0.5.19 and 0.5.20."""


class Runner0521(
    ExtendRange, ResolvedServerArgs, ThreeKernelConfigs, HookedFinalState, BootstrapRunner
):
    """SGLang 0.5.21."""


class Runner0522(
    ExtendEnd, ResolvedServerArgs, FourKernelConfigs, HookedFinalState, BootstrapRunner
):
    """SGLang 0.5.22."""


class Runner0523(ExtendEnd, FourKernelConfigs, BootstrapRunner):
    """SGLang 0.5.23, with the capture-only settings of --enable-return-aux-hidden-states: the
    resolved settings set the capture ids on the model, and the output carries the post-norm
    final state of every token as `last_hidden_states`."""

    def make_server_args(self, s: RunnerSettings) -> None:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import ServerArgs

        load_plugins()
        self.server_args = ServerArgs(
            **s.server_args(),
            enable_return_aux_hidden_states=True,
            speculative_algorithm="EAGLE3",
            return_aux_hidden_state_layer_ids=list(s.layer_ids),
        )
        self.server_args.resolve_once()

    def set_capture(self, s: RunnerSettings) -> None:
        """init_attention_backends set the ids from the resolved settings."""

    def forward(self, schedule: Any) -> tuple[Any, Any]:
        output = self.runner.forward(self.forward_batch(schedule)).logits_output
        return output.hidden_states, output.last_hidden_states


RUNNERS: dict[str, type[ReleaseRunner]] = {
    "0.5.14": Runner0514,
    "0.5.15": Runner0515,
    "0.5.16": Runner0516,
    "0.5.17": Runner0516,
    "0.5.18": Runner0518,
    "0.5.19": Runner0519,
    "0.5.20": Runner0519,
    "0.5.21": Runner0521,
    "0.5.22": Runner0522,
    "0.5.23": Runner0523,
}
