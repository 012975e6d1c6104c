"""Stand-in for sglang.srt.server_args: the ServerArgs fields the capture engine sets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sglang._fake import record


@dataclass
class ServerArgs:
    model_path: str
    trust_remote_code: bool = False
    dtype: str = "auto"
    tp_size: int = 1
    ep_size: int = 1
    pp_size: int = 1
    mem_fraction_static: float | None = None
    disable_radix_cache: bool = False
    chunked_prefill_size: int | None = None
    disable_cuda_graph: bool = False
    skip_tokenizer_init: bool = False
    page_size: int = 1
    device: str = "cuda"

    def __post_init__(self) -> None:
        record("server_args", **dataclasses.asdict(self))
