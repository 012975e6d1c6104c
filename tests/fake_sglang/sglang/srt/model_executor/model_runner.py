"""Stand-in for sglang.srt.model_executor.model_runner.ModelRunner.

Joins torch.distributed as SGLang's init_distributed_environment does (an initialised default
group is used as it is and must hold tp_size x pp_size ranks; with none, one rank initialises its
own), loads the checkpoint's HF model, and runs prefill forwards with SGLang's capture
conventions (sglang/_fake.py). Pools and backends are set up by the caller, as from 0.5.14."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang._fake import CausalLM, LogitsProcessorOutput, record

POOL_SIZE = 64  # requests the request-to-token pool holds (SGLang: max_running_requests)


class Pool:
    def __init__(self, size: int):
        self.size = size
        self.used = 0

    def alloc(self, n: int) -> None:
        if self.used + n > self.size:
            raise RuntimeError(f"pool of {self.size} cannot take {n} more (holds {self.used})")
        self.used += n

    def clear(self) -> None:
        self.used = 0


@dataclass
class ModelRunnerOutput:
    logits_output: LogitsProcessorOutput
    can_run_graph: bool = False


class ModelRunner:
    def __init__(
        self,
        model_config,
        mem_fraction_static: float,
        gpu_id: int,
        tp_rank: int,
        tp_size: int,
        moe_ep_rank: int,
        moe_ep_size: int,
        pp_rank: int,
        pp_size: int,
        nccl_port: int,
        server_args,
        dp_rank=None,
        is_draft_worker: bool = False,
        **_kwargs,
    ):
        if torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            if world != tp_size * pp_size:
                raise RuntimeError(
                    f"world_size ({world}) is not equal to tensor_model_parallel_size "
                    f"({tp_size}) x pipeline_model_parallel_size ({pp_size})"
                )
            if torch.distributed.get_rank() != tp_rank:
                raise RuntimeError(f"tp_rank {tp_rank} is not this process's rank")
        elif tp_size * pp_size != 1:
            raise RuntimeError(
                f"would initialise {tp_size * pp_size} ranks at tcp://127.0.0.1:{nccl_port} "
                f"and wait for the others"
            )
        self.model_config = model_config
        self.server_args = server_args
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.model = CausalLM(model_config.model_path, model_config.architecture)
        self.req_to_token_pool = None
        self.token_to_kv_pool_allocator = None
        self.attn_backend = None
        record(
            "model_runner",
            gpu_id=gpu_id,
            tp_rank=tp_rank,
            tp_size=tp_size,
            moe_ep_rank=moe_ep_rank,
            moe_ep_size=moe_ep_size,
            pp_size=pp_size,
            mem_fraction_static=mem_fraction_static,
        )

    def alloc_memory_pool(self, memory_pool_config=None) -> None:
        self.req_to_token_pool = Pool(POOL_SIZE)
        self.token_to_kv_pool_allocator = Pool(10**9)

    def init_backends(self, disable_cuda_graph: bool = False) -> None:
        if self.req_to_token_pool is None:
            raise RuntimeError("init_backends before alloc_memory_pool")
        self.attn_backend = "stand-in"
        record("init_backends", disable_cuda_graph=disable_cuda_graph)

    def forward(self, forward_batch, skip_attn_backend_init: bool = False, pp_proxy_tensors=None):
        if self.attn_backend is None:
            raise RuntimeError("forward before init_backends")
        record(
            "forward",
            tokens=int(forward_batch.input_ids.numel()),
            lengths=forward_batch.extend_seq_lens_cpu,
            mode=forward_batch.capture_hidden_mode.name,
        )
        out = self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)
        return ModelRunnerOutput(logits_output=out)
