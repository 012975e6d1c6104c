"""Which target layers feed the draft, and the ids each serving engine must be told.

Training reads Hugging Face `output_hidden_states`: index i is the residual stream entering decoder
layer i (index 0 is the embedding output, index N the final normed state). The engines name the
same tensors differently, and both load a checkpoint whatever ids it holds, so a wrong id silently
feeds the draft features it never saw. The facts (SGLang 0.5.x, vLLM 0.x model code):

- SGLang captures, inside its layer loop, the residual stream entering layer j for every j in
  `layers_to_capture` (so layer j's capture equals HF hidden_states[j]). It reads the ids from the
  draft config's `eagle_config.eagle_aux_hidden_state_layer_ids`:
  * Llama / Qwen / Mistral targets: `layers_to_capture = [id + 1 for id in ids]`, so to capture
    HF index i the id written is i - 1.
  * DeepSeek / Kimi targets: ids are shifted by one only when the first id is 1, else used as
    given; writing the HF indices themselves is right whenever the first index is not 1.
  * no ids at all: `[2, N // 2, N - 3]`, unshifted.
- vLLM captures the residual stream entering layer id (`idx in aux_hidden_state_layers`), with the
  ids read unshifted from the draft config's top-level `eagle_aux_hidden_state_layer_ids`; the
  default is also `[2, N // 2, N - 3]`.

For Llama-style targets no single id list serves both engines, but they read different keys, so
the exported config carries both (see export.py). Layer 0's input has no residual yet in either
engine's capture loop, and captures happen in layer order, so indices must be ascending and >= 1.
"""
from __future__ import annotations

SHIFTED_FAMILIES = ("llama", "qwen", "mistral")      # SGLang always adds 1
SHIFTED_IF_ONE_FAMILIES = ("deepseek", "kimi")       # SGLang adds 1 only if the first id is 1


def default_aux_indices(num_layers: int) -> list[int]:
    """HF hidden_states indices of EAGLE-3's default capture: layers 2, N // 2 and N - 3."""
    indices = [2, num_layers // 2, num_layers - 3]
    if not indices[0] < indices[1] < indices[2]:
        raise ValueError(f"a target with {num_layers} layers has no three distinct default "
                         f"capture layers ({indices}); give the aux indices explicitly")
    return indices


def sglang_family(architecture: str) -> str:
    """'shifted' or 'shifted_if_one': how SGLang turns the written ids into captured layers."""
    name = architecture.lower()
    if any(f in name for f in SHIFTED_IF_ONE_FAMILIES):
        return "shifted_if_one"
    if any(f in name for f in SHIFTED_FAMILIES):
        return "shifted"
    raise ValueError(f"target architecture {architecture!r}: unknown SGLang layer-id convention; "
                     f"read its model's set_eagle3_layers_to_capture and add the family to "
                     f"stages/drafter/layers.py")


def sglang_captured_indices(architecture: str, layer_ids: list[int] | None,
                            num_layers: int) -> list[int]:
    """The HF hidden_states indices SGLang feeds the draft for the ids written in its config."""
    if not layer_ids:
        return [2, num_layers // 2, num_layers - 3]
    if sglang_family(architecture) == "shifted" or layer_ids[0] == 1:
        return [i + 1 for i in layer_ids]
    return list(layer_ids)


def vllm_captured_indices(layer_ids: list[int] | None, num_layers: int) -> list[int]:
    """The HF hidden_states indices vLLM feeds the draft for the ids written in its config."""
    return list(layer_ids) if layer_ids else [2, num_layers // 2, num_layers - 3]


def serving_layer_ids(architecture: str, hf_indices: list[int],
                      num_layers: int | None = None) -> dict[str, list[int]]:
    """The ids to write so each engine captures exactly HF hidden_states[hf_indices].

    Returns {"sglang": ids for eagle_config.eagle_aux_hidden_state_layer_ids,
             "vllm": ids for the top-level eagle_aux_hidden_state_layer_ids}.
    Llama-style (N=32, default [2, 16, 29]): sglang [1, 15, 28], vllm [2, 16, 29].
    Kimi-K2 (N=61, default [2, 30, 58]): [2, 30, 58] for both.
    """
    hf_indices = [int(i) for i in hf_indices]
    if any(b <= a for a, b in zip(hf_indices, hf_indices[1:])) or not hf_indices:
        raise ValueError(f"aux indices {hf_indices} must be distinct and ascending: the engines "
                         f"concatenate captures in layer order")
    top = num_layers - 1 if num_layers is not None else None
    if hf_indices[0] < 1 or (top is not None and hf_indices[-1] > top):
        raise ValueError(f"aux indices {hf_indices} must lie in 1..{top if top else 'N-1'}: the "
                         f"engines capture the input of a decoder layer, not the embedding "
                         f"output nor the final normed state")
    if sglang_family(architecture) == "shifted":
        sglang = [i - 1 for i in hf_indices]
    elif hf_indices[0] != 1:
        sglang = list(hf_indices)
    else:
        raise ValueError(f"{architecture}: SGLang cannot capture HF index 1 first (an id list "
                         f"starting with 1 is shifted to 2); start the aux indices at 2 or more")
    return {"sglang": sglang, "vllm": list(hf_indices)}
