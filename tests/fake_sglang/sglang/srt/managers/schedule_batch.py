"""Stand-in for sglang.srt.managers.schedule_batch: Req and ScheduleBatch, for one extend."""

from __future__ import annotations

from dataclasses import dataclass

import torch


class Req:
    def __init__(self, rid, origin_input_text, origin_input_ids, sampling_params, **_kwargs):
        self.rid = rid
        self.origin_input_text = origin_input_text
        self.origin_input_ids = list(origin_input_ids)
        self.sampling_params = sampling_params
        self.fill_ids: list[int] = []
        self.prefix_indices: list[int] = []
        self.extend_input_len = 0
        self.logprob_start_len = 0


@dataclass
class ModelWorkerBatch:
    input_ids: torch.Tensor
    extend_seq_lens: list[int]
    capture_hidden_mode: object


class ScheduleBatch:
    def __init__(self, reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache):
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.tree_cache = tree_cache
        self.input_ids: torch.Tensor | None = None
        self.extend_lens: list[int] = []

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
        **_kwargs,
    ) -> ScheduleBatch:
        return cls(reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache)

    def prepare_for_extend(self) -> None:
        """The tokens each request extends by: past its cached prefix, as many as it says."""
        ids = []
        self.req_to_token_pool.alloc(len(self.reqs))
        for req in self.reqs:
            cached = self.tree_cache.match_prefix(req.fill_ids)
            new = req.fill_ids[cached:]
            if req.extend_input_len != len(req.fill_ids):
                raise ValueError(f"{req.rid}: extend_input_len {req.extend_input_len} is wrong")
            self.token_to_kv_pool_allocator.alloc(len(new))
            ids += new
            self.extend_lens.append(len(new))
        self.input_ids = torch.tensor(ids, dtype=torch.long)

    def get_model_worker_batch(self) -> ModelWorkerBatch:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        return ModelWorkerBatch(self.input_ids, self.extend_lens, CaptureHiddenMode.NULL)
