"""ModelRunner as 0.5.23 builds it: only for a published ServerArgs, on parallel groups the
bootstrap built, no ranks of its own; its attention backends set the capture ids of a
capture-only run on the model. The rest is the same as 0.5.14's (fake_core._ModelRunner)."""

from __future__ import annotations

import fake_core
from fake_core import ModelRunnerOutput, _ModelRunner  # noqa: F401

from sglang.srt.distributed import bootstrap
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.runtime_context import assert_published


class ModelRunner(_ModelRunner):
    def __init__(
        self,
        model_config,
        mem_fraction_static,
        gpu_id,
        nccl_port,
        server_args,
        is_draft_worker=False,
    ):
        assert_published(server_args, role="scheduler")
        if not bootstrap._BUILT:
            raise RuntimeError("ModelRunner before bootstrap.init_parallel_runtime")
        keep_last = server_args.enable_return_aux_hidden_states
        self._load(model_config, server_args, gpu_id, LogitsProcessorOutput, keep_last)
        fake_core.record(
            "model_runner",
            gpu_id=gpu_id,
            tp_size=server_args.tp_size,
            mem_fraction_static=mem_fraction_static,
        )

    def _configure_capture(self) -> None:
        if self.server_args.enable_return_aux_hidden_states:
            ids = self.server_args.return_aux_hidden_state_layer_ids
            self.model.set_eagle3_layers_to_capture(ids)
