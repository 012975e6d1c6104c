"""Target hidden states for EAGLE-3: the residual stream entering chosen layers, and the final
(post-norm) hidden state, captured with forward hooks during one pass of the base model.

Hooks keep only the tapped layers; `output_hidden_states=True` would keep every layer, and the
LM head over the whole vocabulary is never run. This forward is the one extraction benchmarks time.
"""

from __future__ import annotations

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
