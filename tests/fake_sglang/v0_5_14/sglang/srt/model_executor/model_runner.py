"""ModelRunner as 0.5.14 builds it: the constructor takes the ranks, joins the process group and
loads the model; the rest is the same as 0.5.23's (fake_core._ModelRunner)."""

from __future__ import annotations

import fake_core
from fake_core import ModelRunnerOutput, _ModelRunner  # noqa: F401

from sglang.srt.layers.logits_processor import LogitsProcessorOutput


class ModelRunner(_ModelRunner):
    def __init__(
        self,
        model_config,
        mem_fraction_static,
        gpu_id,
        tp_rank,
        tp_size,
        moe_ep_rank,
        moe_ep_size,
        pp_rank,
        pp_size,
        nccl_port,
        server_args,
        dp_rank=None,
    ):
        fake_core.join_group(tp_size, pp_size, tp_rank, nccl_port)
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self._load(model_config, server_args, gpu_id, LogitsProcessorOutput, keep_last=False)
        fake_core.record(
            "model_runner",
            gpu_id=gpu_id,
            tp_rank=tp_rank,
            tp_size=tp_size,
            moe_ep_rank=moe_ep_rank,
            moe_ep_size=moe_ep_size,
            pp_size=pp_size,
            mem_fraction_static=mem_fraction_static,
        )
