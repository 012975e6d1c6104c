"""Target hidden states for EAGLE-3: the residual stream entering chosen layers, and the final
(post-norm) hidden state, captured with forward hooks during one pass of the base model.

Hooks keep only the tapped layers; `output_hidden_states=True` would keep every layer, and the
LM head over the whole vocabulary is never run. This forward is the one extraction benchmarks time.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn


def decoder_parts(model) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
    """(base model, its decoder layers, its final norm) for a Llama-style HF causal LM."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(base, "layers", None)
    norm = getattr(base, "norm", None)
    if layers is None or norm is None:
        raise ValueError(
            f"{type(model).__name__}: no `layers` / `norm` on its decoder; hidden-state "
            f"capture supports Llama-style decoders (Llama, Qwen, Mistral, DeepSeek...)"
        )
    return base, layers, norm


class FeatureExtractor:
    """Run the target's decoder and return (aux [B,T,len(indices)*H], last [B,T,H]).

    `aux_indices` are HF `hidden_states` indices: index i is the input of decoder layer i (index 0
    the embeddings), so each is captured by a pre-hook on layer i.
    """

    def __init__(self, model, aux_indices: list[int]):
        self.model = model
        self.base, layers, norm = decoder_parts(model)
        bad = [i for i in aux_indices if not 0 <= i < len(layers)]
        if bad:
            raise ValueError(
                f"HF hidden-state indices {bad} are outside "
                f"0..{len(layers) - 1} for a {len(layers)}-layer target"
            )
        self.aux_indices = list(aux_indices)
        self._captured: dict = {}
        for i in self.aux_indices:
            layers[i].register_forward_pre_hook(self._capture_input(i), with_kwargs=True)
        norm.register_forward_hook(lambda _m, _a, out: self._captured.__setitem__("last", out))

    def _capture_input(self, index: int):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._captured[index] = hidden

        return hook

    @torch.inference_mode()
    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **inputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, T] -> (aux [B, T, A], last [B, T, H]): a padded batch with its attention
        mask, or samples packed into one row with the row's `inputs` and no mask
        (packing.PackedRow.inputs)."""
        self._captured.clear()
        # no cache: transformers' packed-sequence detection is off with one
        self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **inputs)
        aux = torch.cat([self._captured[i] for i in self.aux_indices], dim=-1)
        last = self._captured["last"]
        self._captured.clear()
        return aux, last


def compile_layers(model, dynamic: bool) -> None:
    """torch.compile each decoder layer on its own (one graph, reused by every layer); the
    capture hooks stay outside the compiled code. `dynamic`: one graph for every row length
    (packed rows) instead of one per shape (a fixed benchmark batch)."""
    _, layers, _ = decoder_parts(model)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, dynamic=dynamic)


class FeatureBuffers:
    """Host memory a shard's features are copied into straight from the device, in `sets` taken
    in turn: one fills while the others wait for their copies to land or are being written, and a
    set is filled again `sets` shards later, when the caller must be done with it (ShardWriter's
    order of waiting makes it so). Pinned on a GPU host, where a copy into pageable memory
    measured about 1 GiB/s on an H200 host and one into pinned memory about 50.

    The sets are allocated on a thread of their own, in the order they are taken, so the caller
    can warm up beside them: pinning the five 2 GiB sets of a Llama-width run took 6.8 s before
    the first forward; started before the warm-up, the loop waited 0.0 s for them, though the
    warm-up beside them took 7.3 s instead of 2.4 (one H200 host)."""

    def __init__(
        self, tokens: int, aux_width: int, hidden: int, dtype: torch.dtype, pin: bool, sets: int
    ):
        def allocate() -> tuple[tuple[torch.Tensor, torch.Tensor], float]:
            start = time.perf_counter()
            aux, last = (
                torch.empty((tokens, width), dtype=dtype, pin_memory=pin)
                for width in (aux_width, hidden)
            )
            return (aux, last), time.perf_counter() - start

        pool = ThreadPoolExecutor(1, thread_name_prefix="feature-buffers")
        self.sets = [pool.submit(allocate) for _ in range(sets)]
        pool.shutdown(wait=False)  # the allocations queued still run
        self.turn = 0

    def take(self, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(aux [tokens, aux_width], last [tokens, hidden]) views of the next set, once it is
        allocated."""
        (aux, last), _ = self.sets[self.turn].result()
        self.turn = (self.turn + 1) % len(self.sets)
        return aux[:tokens], last[:tokens]

    def allocation_s(self) -> float:
        """Seconds the allocations took on their thread (waiting for any still running)."""
        return sum(future.result()[1] for future in self.sets)
