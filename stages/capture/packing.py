"""Samples packed into rows: several samples in one forward, none of them padded.

A row holds consecutive samples up to a token budget; each sample's positions restart at 0 and
its tokens attend only to its own earlier tokens (a document mask), so each sample's features
are those of a forward of its own, up to the rounding of other kernel shapes
(tests/capture/test_packing.py), and nothing is computed for padding.

How the document mask is applied. Given packed `position_ids`, no attention_mask and no cache,
transformers 5.x builds the mask itself (masking_utils.find_packed_sequence_indices) for eager,
sdpa and flex alike, and all three are exact; but eager and sdpa then attend over the whole row
through a dense [T, T] mask (a row of N samples costs N times the attention of its samples,
without sdpa's flash kernel), and the check for packing reads the mask back from the device.
`packed_attention` instead gives FlashAttention-2's variable-length kernel (torch's own, the
one behind sdpa on a GPU) the samples' boundaries: one causal attention per sample, no mask
built, nothing read back; on the CPU, or in a dtype that kernel lacks, sdpa per sample. It is
registered in transformers' AttentionInterface as `PACKED`, which builds no mask for it. A
target with sliding-window layers keeps its own implementation: transformers' mask from the
packed positions applies the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

PACKED = "eagle_pipeline_packed"  # the attention implementation's name in transformers
FLASH_DTYPES = (torch.float16, torch.bfloat16)


def packed_rows(lengths: Sequence[int], budget: int, max_samples: int | None = None) -> list[range]:
    """Consecutive samples (positions in `lengths`) grouped into rows of at most `budget` tokens
    and `max_samples` samples; a sample longer than the budget is a row of its own."""
    rows: list[range] = []
    start = total = 0
    for pos, n in enumerate(lengths):
        full = max_samples is not None and pos - start >= max_samples
        if pos > start and (total + n > budget or full):
            rows.append(range(start, pos))
            start, total = pos, 0
        total += n
    return rows + [range(start, len(lengths))] if lengths else rows


@dataclass(frozen=True)
class PackedRow:
    """One forward's input: `input_ids` and `position_ids` [1, T] (each sample's from 0), and
    `cu_seq_lens` [N + 1] int32, where sample i is tokens cu_seq_lens[i]:cu_seq_lens[i + 1]."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seq_lens: torch.Tensor
    lengths: tuple[int, ...]

    @classmethod
    def of(cls, samples: Sequence[Sequence[int]]) -> PackedRow:
        lengths = tuple(len(s) for s in samples)
        return cls(
            torch.tensor([t for s in samples for t in s], dtype=torch.long)[None],
            torch.cat([torch.arange(n) for n in lengths])[None],
            torch.tensor([0, *accumulate(lengths)], dtype=torch.int32),
            lengths,
        )

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    def inputs(self) -> dict:
        """The model's inputs for this row (FeatureExtractor's): input_ids, each sample's
        positions, and its boundaries for `packed_attention_forward`."""
        return dict(
            input_ids=self.input_ids,
            position_ids=self.position_ids,
            cu_seq_lens_q=self.cu_seq_lens,
            max_length_q=self.max_length,
        )

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Each sample's [start, end) in the row."""
        ends = list(accumulate(self.lengths))
        return [(end - n, end) for n, end in zip(self.lengths, ends)]

    def to(self, device: torch.device) -> PackedRow:
        """On `device`; to a GPU through pinned memory without waiting, so the host can queue
        the next forwards while the device runs this one."""
        if device.type != "cuda":
            return self

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.pin_memory().to(device, non_blocking=True)

        return PackedRow(
            move(self.input_ids), move(self.position_ids), move(self.cu_seq_lens), self.lengths
        )


def warm_up_row(budget: int) -> PackedRow:
    """The row a compiled model first runs: two samples filling about `budget` tokens. Its sizes
    are what the compiled graph's kernels are tuned for, and are all distinct (an odd total,
    unlike any width of a model): torch.compile gives sizes equal when traced one symbol, so a
    real row whose sizes differ would compile again."""
    total = max(budget, 64) | 1
    first = total - total // 3
    return PackedRow.of([[0] * first, [0] * (total - first)])


@torch.library.custom_op("eagle_pipeline::packed_attention", mutates_args=())
def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of each sample of a packed row with itself: query [T, heads, D], key
    [T, kv_heads, D], value [T, kv_heads, Dv] -> [T, heads, Dv]. An op of its own, so that
    torch.compile neither traces into the kernel choice nor specialises on the row's layout."""
    if query.is_cuda and query.dtype in FLASH_DTYPES:
        return _flash_varlen(query, key, value, cu_seq_lens, max_length, scale)
    return _per_sample(query, key, value, cu_seq_lens, scale)


@packed_attention.register_fake
def _packed_attention_shape(query, key, value, cu_seq_lens, max_length, scale):
    return query.new_empty(*query.shape[:2], value.shape[-1])


def _flash_varlen(query, key, value, cu_seq_lens, max_length: int, scale: float) -> torch.Tensor:
    """FlashAttention-2's variable-length forward (grouped kv heads natively); a value head
    narrower than the query's (MLA) padded to it, as the kernel takes one head size."""
    width = value.shape[-1]
    if width != query.shape[-1]:
        value = F.pad(value, (0, query.shape[-1] - width))
    out = torch.ops.aten._flash_attention_forward(
        query, key, value, cu_seq_lens, cu_seq_lens, max_length, max_length, 0.0, True, False,
        scale=scale,
    )[0]  # fmt: skip
    return out if width == query.shape[-1] else out[..., :width].contiguous()


def _per_sample(query, key, value, cu_seq_lens, scale: float) -> torch.Tensor:
    out = query.new_empty(*query.shape[:2], value.shape[-1])
    bounds = cu_seq_lens.tolist()
    for start, end in zip(bounds, bounds[1:]):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        attended = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True
        )
        out[start:end] = attended.transpose(0, 1)
    return out


def packed_attention_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **_,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [1, heads, T, D] (key, value likewise)
    -> ([1, T, heads, Dv], no weights), over one row of PackedRow.inputs()."""
    if cu_seq_lens_q is None or max_length_q is None or query.shape[0] != 1:
        raise ValueError(
            f"attention {PACKED!r} runs one packed row (batch 1) with cu_seq_lens_q and "
            f"max_length_q; this model was switched to it by use_packed_attention: give it "
            f"PackedRow.inputs(), not a padded batch"
        )
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return packed_attention(q, k, v, cu_seq_lens_q, max_length_q, scale)[None], None


AttentionInterface.register(PACKED, packed_attention_forward)


def has_sliding_window(config) -> bool:
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    return bool(window) or "sliding_attention" in layer_types


def use_packed_attention(model) -> None:
    """Switch `model` to `PACKED` attention, unless it has sliding-window layers (transformers'
    own mask from packed positions then). A target whose modeling code does not go through
    transformers' AttentionInterface (some remote code) would attend across samples: refused."""
    if has_sliding_window(model.config):
        return
    model.set_attn_implementation(PACKED)
    if model.config._attn_implementation != PACKED:
        raise ValueError(
            f"{type(model).__name__}: its attention does not go through transformers' "
            f"AttentionInterface, so samples packed into one forward would attend to each "
            f"other; use a transformers-native architecture for extract.engine hf, or "
            f"extract.engine sglang"
        )
