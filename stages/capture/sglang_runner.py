"""The `sglang` capture engine: a target that needs a whole node, captured by SGLang's own model
runner in-process, tensor parallel over the torchrun ranks.

Supported releases: 0.5.14 to 0.5.23 (`releases.SUPPORTED_VERSIONS`); any other is refused
before SGLang is imported. Everything around the capture seam changes between them, so the
runner is built and driven by one adapter per release (capture/runners.py, from each release's
own scheduler-less driver, checked in CI against that release's source).

Samples are packed in order into forwards of at most `max_tokens_per_forward` tokens (capped by
the runner's KV pool) and at most `max_running_requests` samples; the flat outputs are split
back by length. Every TP rank holds the same captures; only rank 0 writes (`role.writes`).

On the CPU the tests drive it with stand-ins of releases (tests/fake_sglang), held to the
releases' signatures; on a GPU `tests/perf/real_sglang.py` runs it with a real release. On a
node, run the canary first (`python -m stages.commands.canary`, README: "Moving to GPUs and
SGLang").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from ..drafter.layers import serving_layer_ids, sglang_captured_indices
from ..engines import EngineError
from .interface import Captured, Role, config_facts
from .packing import packed_rows
from .releases import check_sglang_version
from .runners import RUNNERS, RunnerSettings


class SGLangCaptureError(EngineError):
    """SGLang gave features of the wrong shape, or the run's layout cannot be served."""


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
