"""Which target layers feed the draft, and the ids each serving engine must be told.

Training reads Hugging Face `output_hidden_states`: index i is the residual stream entering decoder
layer i (index 0 is the embedding output, index N the final normed state, which is never an aux
input). Both engines capture the residual stream entering layer j for every j in their capture
list, so capture j is HF index j; what differs is how the ids written in the draft's config.json
become that list. They load a checkpoint whatever ids it holds, so a wrong id silently feeds the
draft features it never saw.

The conventions are one table, `CAPTURE_TABLE`: (engine, model family, version range) -> rule,
where a rule turns the written ids into the captured HF indices. The writer
(`serving_layer_ids`) and the simulation (`sglang_captured_indices`, `vllm_captured_indices`)
both read it, and the writer only returns ids that the simulation maps back onto the trained
indices, so the two cannot disagree. As of SGLang 0.5.x and vLLM:

- SGLang reads `eagle_config.eagle_aux_hidden_state_layer_ids`.
  * Llama / Qwen / Mistral targets (llama.py and friends), every version: id + 1.
  * DeepSeek-V2/V3 and Kimi-K2 targets (deepseek_v2.py): id + 1 before 0.5.13; from 0.5.13,
    id + 1 only when the first id is 1, else the id itself.
  * Kimi-K2.5 (a wrapper around deepseek_v2.py's model): as DeepSeek, but the wrapper passes the
    ids on only from 0.5.10; older versions cannot serve an EAGLE-3 drafter for it.
- vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` and captures the ids as written.
- With no ids written every engine captures its default `[2, N // 2, N - 3]`.

For DeepSeek-family targets, aux indices starting at 2 have one id list that every SGLang version
captures alike (ids i - 1: the first id is 1, so even 0.5.13+ shifts). Other starting indices have
no such list; then the SGLang version that will serve the drafter must be named. Index 1 first
cannot be captured from 0.5.13 on at all (a list starting with id 1 is shifted to 2).

No single id list serves both engines for Llama-style targets, but they read different keys, so
the exported config carries one list for each (see export.py). Captures are concatenated in layer
order, so indices must be ascending, and lie in 1..N-1.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Ids = list | None  # ids as written in a config (None: none written)


def default_aux_indices(num_layers: int) -> list[int]:
    """HF hidden_states indices of EAGLE-3's default capture: layers 2, N // 2 and N - 3."""
    indices = [2, num_layers // 2, num_layers - 3]
    if not indices[0] < indices[1] < indices[2]:
        raise ValueError(
            f"a target with {num_layers} layers has no three distinct default "
            f"capture layers ({indices}); give the aux indices explicitly"
        )
    return indices


# --- rules: written ids -> captured HF indices (ids already known to be non-empty) -------------


def _plus_one(ids: list[int]) -> list[int]:
    return [i + 1 for i in ids]


def _plus_one_if_first_is_one(ids: list[int]) -> list[int]:
    return [i + 1 for i in ids] if ids[0] == 1 else list(ids)


def _as_written(ids: list[int]) -> list[int]:
    return list(ids)


@dataclass(frozen=True)
class Rule:
    text: str  # for messages
    captured: Callable[[list[int]], list[int]] | None  # None: the engine captures nothing


PLUS_ONE = Rule("id + 1", _plus_one)
PLUS_ONE_IF_FIRST_IS_ONE = Rule("id + 1 if the first id is 1, else id", _plus_one_if_first_is_one)
AS_WRITTEN = Rule("id", _as_written)
NOT_PASSED_ON = Rule("ids not passed on to the model: no EAGLE-3 capture", None)


@dataclass(frozen=True)
class Convention:
    """One row of the table: `rule` holds for `engine` serving a target of `family` at versions
    `since` (inclusive, None: every earlier one) up to `before` (exclusive, None: every later)."""

    engine: str
    family: str
    since: str | None
    before: str | None
    rule: Rule

    def covers(self, version: str) -> bool:
        v = parse_version(version)
        return (self.since is None or parse_version(self.since) <= v) and (
            self.before is None or v < parse_version(self.before)
        )

    @property
    def versions(self) -> str:
        if self.since and self.before:
            return f"{self.engine} >= {self.since}, < {self.before}"
        if self.since:
            return f"{self.engine} >= {self.since}"
        if self.before:
            return f"{self.engine} < {self.before}"
        return f"{self.engine} (all versions)"


SGLANG, VLLM = "SGLang", "vLLM"
CAPTURE_TABLE: tuple[Convention, ...] = (
    #          engine  family         since     before    written ids -> captured HF indices
    Convention(SGLANG, "llama", None, None, PLUS_ONE),
    Convention(SGLANG, "deepseek_v2", None, "0.5.13", PLUS_ONE),
    Convention(SGLANG, "deepseek_v2", "0.5.13", None, PLUS_ONE_IF_FIRST_IS_ONE),
    Convention(SGLANG, "kimi_k25", None, "0.5.10", NOT_PASSED_ON),
    Convention(SGLANG, "kimi_k25", "0.5.10", "0.5.13", PLUS_ONE),
    Convention(SGLANG, "kimi_k25", "0.5.13", None, PLUS_ONE_IF_FIRST_IS_ONE),
    Convention(VLLM, "any", None, None, AS_WRITTEN),
)

# Family by the target's architecture name (lower case, without "_" and "-"), first match wins:
# kimik25 before kimik2.
SGLANG_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kimi_k25", ("kimik25",)),
    ("deepseek_v2", ("deepseekv2", "deepseekv3", "kimik2")),
    ("llama", ("llama", "qwen", "mistral")),
)


def parse_version(version: str) -> tuple[int, ...]:
    """'0.5.13' -> (0, 5, 13), for comparison. A suffix after the release number (rc1, .post1,
    +cu128) is ignored: the release number decides the convention."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(version))
    if not match:
        raise ValueError(f"SGLang version {version!r}: expected a release number like '0.5.13'")
    parts = [int(p) for p in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def sglang_family(architecture: str) -> str:
    """The family of SGLang model code serving `architecture` (a key of CAPTURE_TABLE)."""
    name = re.sub(r"[_\-]", "", architecture.lower())
    for family, patterns in SGLANG_FAMILIES:
        if any(p in name for p in patterns):
            return family
    raise ValueError(
        f"target architecture {architecture!r}: unknown SGLang layer-id convention; "
        f"read its model's set_eagle3_layers_to_capture and add the family to "
        f"stages/drafter/layers.py"
    )


def sglang_conventions(architecture: str, sglang_version: str | None = None) -> list[Convention]:
    """The rows that apply: the one covering `sglang_version`, or (None) every version range that
    can serve an EAGLE-3 drafter for this target. A named version that cannot raises."""
    family = sglang_family(architecture)
    rows = [c for c in CAPTURE_TABLE if c.engine == SGLANG and c.family == family]
    if sglang_version is None:
        return [c for c in rows if c.rule.captured is not None]
    row = next(c for c in rows if c.covers(sglang_version))
    if row.rule.captured is None:
        raise ValueError(
            f"{architecture} on SGLang {sglang_version}: {row.rule.text} "
            f"({row.versions}); serve it with SGLang {_first_capturing(rows)} or "
            f"later"
        )
    return [row]


def _first_capturing(rows: list[Convention]) -> str:
    return next(c.since for c in rows if c.rule.captured is not None and c.since)


def _captured(row: Convention, layer_ids: Ids, num_layers: int) -> list[int]:
    if not layer_ids:
        return [2, num_layers // 2, num_layers - 3]
    if row.rule.captured is None:  # the callers pass only rows that capture
        raise ValueError(f"{row.versions}: {row.rule.text}")
    return row.rule.captured([int(i) for i in layer_ids])


def sglang_captured_by_version(
    architecture: str, layer_ids: Ids, num_layers: int, sglang_version: str | None = None
) -> dict[str, list[int]]:
    """Version range -> the HF hidden_states indices SGLang feeds the draft for `layer_ids`
    (the ids in eagle_config), for the named version or every version range that can serve."""
    return {
        row.versions: _captured(row, layer_ids, num_layers)
        for row in sglang_conventions(architecture, sglang_version)
    }


def sglang_captured_indices(
    architecture: str, layer_ids: Ids, num_layers: int, sglang_version: str | None = None
) -> list[int]:
    """The HF hidden_states indices SGLang feeds the draft for the ids written in its config, at
    `sglang_version`, or (None) at every known version; raises when versions capture differently.
    """
    by_version = sglang_captured_by_version(architecture, layer_ids, num_layers, sglang_version)
    distinct = {tuple(v) for v in by_version.values()}
    if len(distinct) > 1:
        raise ValueError(
            f"{architecture}: SGLang ids {layer_ids} capture different HF hidden "
            f"states on different SGLang versions: {_listing(by_version)}; write ids "
            f"for one version (sglang_version) or ids every version reads alike"
        )
    return list(distinct.pop())


def vllm_captured_indices(layer_ids: Ids, num_layers: int) -> list[int]:
    """The HF hidden_states indices vLLM feeds the draft for the ids written in its config."""
    return _captured(_vllm_convention(), layer_ids, num_layers)


def _vllm_convention() -> Convention:
    (row,) = [c for c in CAPTURE_TABLE if c.engine == VLLM]
    return row


def _listing(by_version: Mapping[str, object]) -> str:
    return "; ".join(f"{versions}: {value}" for versions, value in by_version.items())


def serving_layer_ids(
    architecture: str,
    hf_indices: list[int],
    num_layers: int | None = None,
    sglang_version: str | None = None,
) -> dict[str, list[int]]:
    """The ids to write so each engine captures exactly HF hidden_states[hf_indices].

    Returns {"sglang": ids for eagle_config.eagle_aux_hidden_state_layer_ids,
             "vllm": ids for the top-level eagle_aux_hidden_state_layer_ids}.
    The SGLang ids serve every known SGLang version, or only `sglang_version` when one is named
    (e.g. "0.5.12"); when no single list serves every version, naming one is required.
    Llama-style (N=32, default [2, 16, 29]): sglang [1, 15, 28], vllm [2, 16, 29].
    Kimi-K2 / DeepSeek-V3 (N=61, default [2, 30, 58]): sglang [1, 29, 57], vllm [2, 30, 58].
    """
    hf_indices = [int(i) for i in hf_indices]
    if any(b <= a for a, b in zip(hf_indices, hf_indices[1:])) or not hf_indices:
        raise ValueError(
            f"aux indices {hf_indices} must be distinct and ascending: the engines "
            f"concatenate captures in layer order"
        )
    top = num_layers - 1 if num_layers is not None else None
    if hf_indices[0] < 1 or (top is not None and hf_indices[-1] > top):
        raise ValueError(
            f"aux indices {hf_indices} must lie in 1..{top if top else 'N-1'}: the "
            f"engines capture the input of a decoder layer, not the embedding "
            f"output nor the final normed state"
        )
    n = num_layers if num_layers is not None else hf_indices[-1] + 1  # only used with no ids
    rows = sglang_conventions(architecture, sglang_version)
    sglang = _ids_serving(rows, hf_indices, n)
    if sglang is not None:
        vllm = _ids_serving([_vllm_convention()], hf_indices, n)
        if vllm is None:  # vLLM captures the ids as written, and the indices are all >= 1
            raise ValueError(f"{architecture}: no vLLM layer ids capture {hf_indices}")
        return {"sglang": sglang, "vllm": vllm}
    needs = "; ".join(
        f"{row.versions} needs ids {ids}"
        if ids is not None
        else f"{row.versions} cannot capture them ({row.rule.text})"
        for row in rows
        for ids in [_ids_serving([row], hf_indices, n)]
    )
    if sglang_version is not None:
        raise ValueError(
            f"{architecture} on SGLang {sglang_version}: no layer ids capture HF "
            f"hidden states {hf_indices} ({needs}); start the aux indices at 2 or "
            f"more"
        )
    examples = " or ".join(repr(row.since or _release_before(row.before)) for row in rows)
    raise ValueError(
        f"{architecture}: no single SGLang id list captures HF hidden states "
        f"{hf_indices} on every SGLang version: {needs}. Name the SGLang version "
        f"that will serve the drafter (sglang_version={examples}), or start the aux "
        f"indices at 2 or more (ids i - 1, read alike by every version)"
    )


def _release_before(version: str | None) -> str:
    """An example release in a range that ends before `version`: '0.5.13' -> '0.5.12'."""
    parts = list(parse_version(version or "0"))
    parts[-1] = max(parts[-1] - 1, 0)
    return ".".join(map(str, parts))


def _ids_serving(
    rows: list[Convention], hf_indices: list[int], num_layers: int
) -> list[int] | None:
    """The id list that every row in `rows` turns into exactly `hf_indices`, or None.

    Every rule in the table shifts by 0 or 1, so the indices minus one and the indices themselves
    are the only lists worth trying; minus one comes first (for DeepSeek targets it is the list
    every SGLang version reads alike, as its first id is 1)."""
    for ids in ([i - 1 for i in hf_indices], list(hf_indices)):
        if min(ids) >= 0 and all(_captured(row, ids, num_layers) == hf_indices for row in rows):
            return ids
    return None
