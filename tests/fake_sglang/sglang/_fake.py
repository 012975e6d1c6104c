"""The stand-in's model: a Hugging Face checkpoint run one sequence at a time, with SGLang's
layer-capture conventions and the shape of its logits-processor output.

The conventions are written here from SGLang's model code as docs/serving.md section 4 describes
it, independently of stages/drafter/layers.py (the code under test):
- llama.py (Llama, Qwen, Mistral), every version: capture ids + 1;
- deepseek_v2.py (DeepSeek-V2/V3, Kimi-K2) before 0.5.13: ids + 1; from 0.5.13: ids + 1 when the
  first id is 1, else the ids as given;
- no ids (None): [2, N // 2, N - 3].
Capture j is the input of decoder layer j, which is HF hidden_states[j].
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM

RECORD: list[dict] = []


def record(event: str, **values: Any) -> None:
    """Keep what the runner saw; with FAKE_SGLANG_RECORD also append it to that file (JSON lines,
    with the torchrun rank)."""
    entry = {"event": event, "rank": int(os.environ.get("RANK", "0")), **values}
    RECORD.append(entry)
    path = os.environ.get("FAKE_SGLANG_RECORD", "").replace("{rank}", str(entry["rank"]))
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def version() -> tuple[int, ...]:
    text = importlib.metadata.version("sglang")
    return tuple(int(p) for p in re.match(r"(\d+(?:\.\d+)*)", text).group(1).split("."))


def family(architecture: str) -> str:
    name = architecture.lower()
    if "deepseek" in name or "kimik2" in name:
        return "deepseek_v2"
    if any(k in name for k in ("llama", "qwen", "mistral")):
        return "llama"
    raise NotImplementedError(f"the SGLang stand-in has no model code for {architecture}")


def layers_to_capture(arch: str, layer_ids: list[int] | None, num_layers: int) -> list[int]:
    """What SGLang's model code of `arch` captures for `layer_ids`, at the reported version."""
    if layer_ids is None:
        return [2, num_layers // 2, num_layers - 3]
    ids = [int(i) for i in layer_ids]
    if family(arch) == "llama" or version() < (0, 5, 13):
        return [i + 1 for i in ids]
    return [i + 1 for i in ids] if ids[0] == 1 else ids


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor
    hidden_states: torch.Tensor | None = None
    last_hidden_states: torch.Tensor | None = None


class LogitsProcessor(nn.Module):
    """As SGLang's: given the post-norm states of every token (and the aux captures), the logits
    of each sequence's last token; with capture mode FULL the aux captures side by side (or, when
    none were asked for, the final states) as `hidden_states`. Whether the output also carries
    `last_hidden_states` is the stand-in's switch FAKE_SGLANG_NO_LAST (set: it does not)."""

    def forward(self, input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states=None):
        ends = torch.tensor(forward_batch.extend_seq_lens_cpu).cumsum(0) - 1
        logits = lm_head(hidden_states[ends])
        out = LogitsProcessorOutput(next_token_logits=logits)
        if forward_batch.capture_hidden_mode.is_full():
            out.hidden_states = (
                torch.cat(aux_hidden_states, dim=-1) if aux_hidden_states else hidden_states
            )
        if not os.environ.get("FAKE_SGLANG_NO_LAST"):
            out.last_hidden_states = hidden_states
        return out


class CausalLM(nn.Module):
    """The checkpoint's HF model behind SGLang's model interface."""

    def __init__(self, path: str, architecture: str):
        super().__init__()
        self.hf = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, local_files_only=True
        ).eval()
        self.architecture = architecture
        self.num_layers = int(self.hf.config.num_hidden_layers)
        self.capture: list[int] | None = None  # layers whose inputs are captured
        self.logits_processor = LogitsProcessor()

    def set_eagle3_layers_to_capture(self, layer_ids: list[int] | None = None) -> None:
        self.capture = layers_to_capture(self.architecture, layer_ids, self.num_layers)
        record("set_eagle3_layers_to_capture", ids=layer_ids, captures=self.capture)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch):
        finals, aux = [], []
        start = 0
        for n in forward_batch.extend_seq_lens_cpu:
            ids = input_ids[start : start + n][None]
            start += n
            out = self.hf(input_ids=ids, output_hidden_states=True, use_cache=False)
            finals.append(out.hidden_states[-1][0])
            if self.capture is not None:
                aux.append([out.hidden_states[j][0] for j in self.capture])
        hidden = torch.cat(finals)
        captured = (
            [torch.cat([a[k] for a in aux]) for k in range(len(self.capture))]
            if self.capture is not None
            else None
        )
        return self.logits_processor(
            input_ids, hidden, self.hf.get_output_embeddings(), forward_batch, captured
        )
