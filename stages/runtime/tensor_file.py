"""Tensors written in the safetensors format straight from their memory, for shards of gigabytes."""

from __future__ import annotations

import json
from typing import BinaryIO

from .files import HashingWriter

# torch's dtypes by safetensors' names, in the order of safetensors' own dtype list: a file holds
# its tensors by that order, last first, then by name
SAFETENSORS_DTYPES = {
    "torch.bool": "BOOL",
    "torch.uint8": "U8",
    "torch.int8": "I8",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.int16": "I16",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int32": "I32",
    "torch.float32": "F32",
    "torch.float64": "F64",
    "torch.int64": "I64",
}
DTYPE_ORDER = {name: rank for rank, name in enumerate(SAFETENSORS_DTYPES)}
WRITE_CHUNK = 64 << 20  # bytes a write (and a hash update) takes at a time


def save_safetensors(
    tensors: dict, out: BinaryIO | HashingWriter, metadata: dict[str, str] | None = None
) -> None:
    """`tensors` (name -> CPU tensor) in the safetensors format, written to `out` straight from
    their memory: the same bytes as safetensors' `save_file` (its dtype order, then by name; the
    header padded to 8 bytes), without the copy of every tensor it makes first, so a shard of
    gigabytes is written once (with atomic_file: and hashed in the same pass)."""
    import torch  # here, so that the stages writing no tensors do not load it

    for name, t in tensors.items():
        if str(t.dtype) not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r}: safetensors has no dtype for {t.dtype}")
    names = sorted(tensors, key=lambda name: (-DTYPE_ORDER[str(tensors[name].dtype)], name))
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in names:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[str(t.dtype)],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    out.write(len(text).to_bytes(8, "little"))
    out.write(text)
    for name in names:
        data = memoryview(tensors[name].contiguous().view(-1).view(torch.uint8).numpy())
        for start in range(0, len(data), WRITE_CHUNK):
            out.write(data[start : start + WRITE_CHUNK])
