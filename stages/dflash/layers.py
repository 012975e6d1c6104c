"""Which target layers a DFlash draft reads, in SGLang's ids and as HF hidden-state indices: what
the extract stage must capture for it, known before any model is built."""

from __future__ import annotations


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The target layers SGLang conditions a draft on when its config names none
    (dflash_utils.py `build_target_layer_ids`, the same in 0.5.14 to 0.5.23): the middle layer
    for one draft layer, else `num_draft_layers` ids spread evenly over 1 .. N - 3, each rounded
    half to even as Python's round() does."""
    if num_target_layers <= 0 or num_draft_layers <= 0:
        raise ValueError(
            f"default_target_layer_ids: {num_target_layers} target layers, {num_draft_layers} "
            "draft layers; both must be positive"
        )
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(
            f"default_target_layer_ids: {num_target_layers} target layers; spreading several "
            "draft layers needs at least 4 (name the target_layer_ids instead)"
        )
    step = (end - start) / (num_draft_layers - 1)
    return [round(start + i * step) for i in range(num_draft_layers)]


def layer_ids_from_hf_indices(hf_indices: list[int]) -> list[int]:
    """DFlash target layer ids for features stored at these HF `hidden_states` indices.

    Id k means the output of target layer k, HF hidden_states[k + 1]: SGLang's
    `set_dflash_layers_to_capture` captures before layer k + 1 (llama.py, qwen3.py,
    deepseek_v2.py, kimi_k25.py; every release)."""
    if any(i < 1 for i in hf_indices):
        raise ValueError(
            f"HF hidden-state indices {hf_indices}: index 0 is the embedding output, which no "
            "DFlash layer id captures; use indices from 1"
        )
    return [i - 1 for i in hf_indices]


def hf_indices_read(
    target_layer_ids: list[int] | None, num_target_layers: int, num_draft_layers: int
) -> list[int]:
    """The HF hidden-state indices a draft reads: those of `target_layer_ids` (id k: HF index
    k + 1), or of SGLang's default ids for `num_draft_layers` draft layers when None; refused
    where an id is no layer whose output a later layer takes."""
    ids = target_layer_ids or default_target_layer_ids(num_target_layers, num_draft_layers)
    outside = [i for i in ids if not 0 <= i < num_target_layers - 1]
    if outside:
        raise ValueError(
            f"ids {outside} are outside 0 .. {num_target_layers - 2}: id k is the output of "
            f"layer k as layer k + 1 takes it, and the target has {num_target_layers} layers; "
            "name ids in that range, or null for SGLang's choice"
        )
    return [i + 1 for i in ids]
