"""The aux hidden states a running SGLang server captures (>= 0.5.23), for the canary only.

A server launched with `--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
--disable-radix-cache` (and `--return-aux-hidden-state-layer-ids <ids>`) answers a /generate
request with `return_hidden_states: true` with the aux layers side by side in
`meta_info.hidden_states`, element 0 covering the prefill: [T][num_aux * H] JSON floats. The final
state is not returned. Hundreds of KB of JSON per token at H = 7168: a spot check of a few
samples, never a bulk path (docs/serving.md section 5).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import torch

from ..drafter.layers import parse_version
from ..engines import EngineError, auth_failure, bearer_headers, redact

SERVES_AUX_SINCE = "0.5.23"  # the first release with --enable-return-aux-hidden-states


def serves_aux(version: str) -> bool:
    """Whether a server of SGLang `version` can return the aux hidden states over HTTP."""
    return parse_version(version) >= parse_version(SERVES_AUX_SINCE)


def served_flags(layer_ids: Sequence[int]) -> str:
    """The launch flags the canary's server needs, for the ids that capture the recorded layers."""
    return (
        "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 --disable-radix-cache "
        f"--return-aux-hidden-state-layer-ids {' '.join(str(i) for i in layer_ids)}"
    )


def request_body(input_ids: Sequence[int]) -> dict:
    return {
        "input_ids": list(input_ids),
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_hidden_states": True,
        "stream": False,
    }


def prefill_aux(reply: dict, tokens: int, width: int) -> torch.Tensor:
    """[tokens, width] from a /generate reply's meta_info.hidden_states element 0."""
    states = (reply.get("meta_info") or {}).get("hidden_states")
    if not states:
        raise EngineError(
            "the server returned no meta_info.hidden_states: launch it with "
            "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 (SGLang >= 0.5.23)"
        )
    prefill = torch.tensor(states[0], dtype=torch.float32)
    if prefill.dim() == 1:
        prefill = prefill.reshape(-1, width) if prefill.numel() % width == 0 else prefill[None]
    if tuple(prefill.shape) != (tokens, width):
        raise EngineError(
            f"the server's prefill hidden states are {tuple(prefill.shape)} for a prompt of "
            f"{tokens} tokens, expected ({tokens}, {width}): a radix-cache hit leaves the cached "
            f"prefix out (launch with --disable-radix-cache), and width {width} needs the aux "
            f"layers (--enable-return-aux-hidden-states), not the final state"
        )
    return prefill


def served_aux(
    url: str,
    input_ids: Sequence[int],
    width: int,
    timeout_s: float = 600.0,
    api_key: str | None = None,
) -> torch.Tensor:
    """The server's aux hidden states of one prompt: [T, width] float32. `api_key`: sent as a
    bearer token (SGLang's --api-key), never written into an error."""
    try:
        reply = httpx.post(
            f"{url.rstrip('/')}/generate",
            json=request_body(input_ids),
            timeout=timeout_s,
            trust_env=False,
            headers=bearer_headers(api_key),
        )
    except httpx.HTTPError as err:
        raise EngineError(redact(f"{url}/generate: {err}", api_key)) from None
    if reply.status_code in (401, 403):
        raise auth_failure(f"{url}/generate", reply.status_code, reply.text[:200], api_key)
    if reply.status_code != 200:
        raise EngineError(
            redact(f"{url}/generate answered {reply.status_code}: {reply.text[:300]}", api_key)
        )
    body = reply.json()
    return prefill_aux(body[0] if isinstance(body, list) else body, len(input_ids), width)
