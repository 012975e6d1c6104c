"""The in-process engine: a transformers causal LM, batched with left padding.

The embedded default and the reference the HTTP engines are compared against.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator

import torch
from transformers import GenerationConfig

from . import Completion, Request, Sampling, ready_batch, trim_at_stop


def context_length(model) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)


class HFEngine:
    name = "hf"

    def __init__(self, model, pad_id: int, batch_size: int = 16):
        self.model, self.pad_id, self.batch_size = model, pad_id, batch_size
        self.slots = batch_size
        self.device = next(model.parameters()).device
        self.context = context_length(model)

    def generate(
        self, requests: Iterable[Request | None], sampling: Sampling
    ) -> Iterator[Completion]:
        requests = iter(requests)
        while batch := ready_batch(requests, self.batch_size):
            over = [(sid, p) for sid, p in batch if len(p) + sampling.max_new_tokens > self.context]
            for sid, prompt in over:
                yield Completion(
                    sid,
                    [],
                    "abort",
                    0.0,
                    error=(
                        f"prompt of {len(prompt)} tokens + max_new_tokens "
                        f"{sampling.max_new_tokens} is over the context length {self.context}"
                    ),
                )
            fits = [r for r in batch if r not in over]
            if fits:
                yield from self._generate_batch(fits, sampling)

    @torch.inference_mode()
    def _generate_batch(
        self, batch: list[tuple[str, list[int]]], sampling: Sampling
    ) -> list[Completion]:
        start = time.monotonic()
        width = max(len(p) for _, p in batch)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (_, prompt) in enumerate(batch):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention[row, width - len(prompt) :] = 1
        greedy = sampling.temperature < 1e-6
        if not greedy:
            torch.manual_seed(_batch_seed(sampling.seed, [sid for sid, _ in batch]))
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy or sampling.top_k < 0 else sampling.top_k,
            eos_token_id=list(sampling.stop_ids) or None,
            pad_token_id=self.pad_id,
        )
        out = self.model.generate(
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            generation_config=config,
        )
        latency = time.monotonic() - start
        results = []
        for row, (sid, _) in enumerate(batch):
            ids, reason = trim_at_stop(
                out[row, width:].tolist(), sampling.stop_ids, sampling.max_new_tokens
            )
            results.append(Completion(sid, ids, reason, latency))
        return results


def _batch_seed(seed: int, sample_ids: list[str]) -> int:
    """A seed fixed by the run seed and the batch's samples, so a rerun samples the same tokens."""
    digest = hashlib.sha256(f"{seed}:{'|'.join(sample_ids)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)
