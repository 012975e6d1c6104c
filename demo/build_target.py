"""Build the demo target: a tiny Kimi-K2.5-like reasoning model trained on the synthetic corpus.

    python -m demo.build_target --out data/demo/target [--steps N --seed S]

Trains a byte-level BPE tokenizer with Kimi's special tokens, a small Llama on the corpus rendered
with the chat template (loss on the replies), then measures its greedy behaviour on the held-out
demo prompts and writes a standard Hugging Face directory (plus build_info.json) atomically.
Runs offline; the default build takes about ten minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)
from transformers.utils.chat_template_utils import render_jinja_template

from demo.corpus import Conversation, demo_conversations, training_corpus

END_OF_TURN = "<|im_end|>"
SPECIAL_TOKENS = (
    "[BOS]",
    "[EOS]",
    END_OF_TURN,
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
    "[PAD]",
    "[UNK]",
)
CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()


@dataclass(frozen=True)
class BuildConfig:
    """Everything that shapes the target; the defaults build the committed data/demo/target."""

    seed: int = 0
    steps: int = 2000
    conversations: int = 12000
    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    max_positions: int = 2048
    batch_tokens: int = 2048  # padded tokens per optimizer step
    learning_rate: float = 3e-3
    final_learning_rate: float = 3e-4  # the cosine decays to this
    warmup_steps: int = 40
    demo_prompts: int = 40  # per demo source, for the measured behaviour
    max_new_tokens: int = 512
    dtype: str = "bfloat16"  # of the saved weights; training and measuring run in float32
    device: str = "cpu"  # where to train and measure; the default build runs on a laptop CPU


# --- tokenizer --------------------------------------------------------------------------------


def _rendered(conversation: Conversation) -> str:
    """The conversation as the chat template renders it, before any tokenizer exists."""
    # transformers annotates render_jinja_template as returning str: it returns (texts, indices)
    texts, _ = render_jinja_template(  # type: ignore[str-unpack]
        [conversation.messages],
        tools=conversation.tools,  # type: ignore[arg-type]  # a list[dict] is a valid tools list
        chat_template=CHAT_TEMPLATE,
    )
    return texts[0]


def train_tokenizer(conversations: list[Conversation], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the rendered corpus, with Kimi's special tokens as single ids."""
    specials = re.compile("|".join(map(re.escape, SPECIAL_TOKENS)))
    texts = (piece for c in conversations for piece in specials.split(_rendered(c)) if piece)
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [  # one token per digit: numbers copy digitwise
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS),
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    named = {"[BOS]", "[EOS]", END_OF_TURN, "[PAD]", "[UNK]"}
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="[BOS]",
        eos_token=END_OF_TURN,
        unk_token="[UNK]",
        pad_token="[PAD]",
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in named],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def render(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None,
    generation_prompt: bool = False,
    thinking: bool = True,
) -> str:
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        tokenize=False,
        add_generation_prompt=generation_prompt,
        thinking=thinking,
    )


def encode(tokenizer, conversation: Conversation) -> tuple[list[int], int]:
    """Token ids of the whole conversation, and the length of its prompt (all before the reply)."""
    prompt = render(
        tokenizer,
        conversation.prompt,
        conversation.tools,
        generation_prompt=True,
        thinking=conversation.thinking,
    )
    full = render(tokenizer, conversation.messages, conversation.tools)
    if not full.startswith(prompt):
        raise ValueError(
            f"the rendered prompt is not a prefix of the rendered conversation:\n"
            f"{prompt!r}\nvs\n{full!r}\nfix the chat template or the reply"
        )
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    reply_ids = tokenizer.encode(full[len(prompt) :], add_special_tokens=False)
    return prompt_ids + reply_ids, len(prompt_ids)


# --- model and training -----------------------------------------------------------------------


def build_model(tokenizer, config: BuildConfig) -> LlamaForCausalLM:
    torch.manual_seed(config.seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.layers,
            num_attention_heads=config.heads,
            num_key_value_heads=config.kv_heads,
            head_dim=config.hidden_size // config.heads,
            max_position_embeddings=config.max_positions,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def batches(
    samples: list[tuple[list[int], int]], batch_tokens: int, pad_id: int, generator: torch.Generator
):
    """Endless shuffled batches of similar-length samples, each at most `batch_tokens` padded."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i][0]))
    groups: list[list[int]] = []
    group: list[int] = []
    for i in order:
        if group and (len(group) + 1) * len(samples[i][0]) > batch_tokens:
            groups.append(group)
            group = []
        group.append(i)
    groups.append(group)
    while True:
        for g in torch.randperm(len(groups), generator=generator).tolist():
            yield collate([samples[i] for i in groups[g]], pad_id)


def collate(samples: list[tuple[list[int], int]], pad_id: int):
    """Right-padded input ids, attention mask and labels that supervise only the replies."""
    width = max(len(ids) for ids, _ in samples)
    input_ids = torch.full((len(samples), width), pad_id)
    labels = torch.full((len(samples), width), -100)
    mask = torch.zeros((len(samples), width), dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(samples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, prompt_len : len(ids)] = torch.tensor(ids[prompt_len:])
        mask[row, : len(ids)] = 1
    return input_ids, mask, labels


def learning_rate(step: int, config: BuildConfig) -> float:
    """Linear warmup, then cosine decay to the final learning rate."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return config.final_learning_rate + (config.learning_rate - config.final_learning_rate) * cosine


def train(
    model: LlamaForCausalLM, samples: list[tuple[list[int], int]], config: BuildConfig
) -> dict:
    """Plain AdamW on the reply tokens; returns the final loss and the throughput (padded tokens
    processed, the compute actually spent)."""
    generator = torch.Generator().manual_seed(config.seed)
    pad_id = model.config.pad_token_id
    if pad_id is None:  # build_model sets the tokenizer's
        raise ValueError("the demo target's config has no pad_token_id")
    stream = batches(samples, config.batch_tokens, pad_id, generator)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, betas=(0.9, 0.95), weight_decay=0.01
    )
    model.train()
    losses, tokens, start = [], 0, time.perf_counter()
    columns = (
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[status]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns) as progress:
        task = progress.add_task("train", total=config.steps, status="")
        for step in range(config.steps):
            input_ids, mask, labels = (t.to(config.device) for t in next(stream))
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, config)
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            tokens += mask.numel()
            rate = tokens / (time.perf_counter() - start)
            status = f"loss {sum(losses[-20:]) / len(losses[-20:]):.4f}  {rate:,.0f} tok/s"
            progress.update(task, advance=1, status=status)
            if not progress.console.is_terminal and (step + 1) % 50 == 0:
                progress.console.print(f"step {step + 1}/{config.steps}  {status}")
    seconds = time.perf_counter() - start
    tail = losses[-max(1, config.steps // 20) :]
    return {
        "final_loss": round(sum(tail) / len(tail), 5),
        "padded_tokens": tokens,
        "train_seconds": round(seconds, 1),
        "tokens_per_second": round(tokens / seconds),
    }


# --- greedy behaviour -------------------------------------------------------------------------


@torch.no_grad()
def greedy_replies(
    model, tokenizer, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 16
) -> list[list[int]]:
    """Greedy continuations of each prompt (left-padded batches), cut after the end of turn."""
    model.eval()
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    replies: list[list[int]] = [[] for _ in prompts]
    for first in range(0, len(order), batch_size):
        rows = order[first : first + batch_size]
        width = max(len(prompts[i]) for i in rows)
        input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, i in enumerate(rows):
            input_ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        output = model.generate(
            input_ids=input_ids.to(model.device),
            attention_mask=mask.to(model.device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=end,
            pad_token_id=tokenizer.pad_token_id,
        )
        for row, i in enumerate(rows):
            ids = output[row, width:].tolist()
            replies[i] = ids[: ids.index(end) + 1] if end in ids else ids
    return replies


TOOL_CALL = re.compile(
    r"<\|tool_call_begin\|>functions\.([\w.-]+):(\d+)"
    r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>",
    re.S,
)
SECTION = re.compile(r"<\|tool_calls_section_begin\|>(.*?)<\|tool_calls_section_end\|>", re.S)


def describe_reply(tokenizer, ids: list[int]) -> dict:
    """What a generated reply contains: closed reasoning, end of turn, tool calls (name, args)."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    calls = []
    for section in SECTION.findall(text):
        for name, _, arguments in TOOL_CALL.findall(section):
            try:
                calls.append((name, json.loads(arguments)))
            except json.JSONDecodeError:
                calls.append((name, None))
    return {
        "tokens": len(ids),
        "closed_reasoning": "</think>" in text,
        "ended": text.endswith(END_OF_TURN),
        "well_formed": text.count("</think>") == 1 and text.endswith(END_OF_TURN),
        "tool_calls": calls,
        "text": text,
    }


def expected_call(conversation: Conversation) -> tuple[str, dict] | None:
    calls = conversation.reply.get("tool_calls")
    if not calls:
        return None
    return calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])


def measure(model, tokenizer, demo: dict[str, list[Conversation]], max_new_tokens: int) -> dict:
    """Greedy behaviour on the held-out demo prompts: shares over all prompts (tool calls over
    those whose reference reply is a call), reply lengths in tokens per kind."""
    conversations = [c for source in demo.values() for c in source]
    encoded = [encode(tokenizer, c) for c in conversations]
    replies = greedy_replies(model, tokenizer, [ids[:n] for ids, n in encoded], max_new_tokens)
    described = [describe_reply(tokenizer, r) for r in replies]
    references = [tokenizer.decode(ids[n:], skip_special_tokens=False) for ids, n in encoded]
    wanted_calls = [
        (d, expected_call(c))
        for c, d in zip(conversations, described)
        if expected_call(c) is not None
    ]
    lengths: dict[str, list[int]] = {}
    for c, d in zip(conversations, described):
        lengths.setdefault(c.kind, []).append(d["tokens"])

    def share(flags) -> float:
        flags = list(flags)
        return round(sum(flags) / max(1, len(flags)), 4)

    return {
        "prompts": len(conversations),
        "well_formed_share": share(d["well_formed"] for d in described),
        "closed_reasoning_share": share(d["closed_reasoning"] for d in described),
        "ended_share": share(d["ended"] for d in described),
        "tool_call_share": share(
            len(d["tool_calls"]) == 1 and d["tool_calls"][0][1] is not None for d, _ in wanted_calls
        ),
        "tool_call_exact_share": share(d["tool_calls"] == [want] for d, want in wanted_calls),
        "reference_match_share": share(d["text"] == ref for d, ref in zip(described, references)),
        "mean_reply_tokens": {k: round(sum(v) / len(v), 1) for k, v in lengths.items()},
        "min_reply_tokens": {k: min(v) for k, v in lengths.items()},
        "max_reply_tokens": {k: max(v) for k, v in lengths.items()},
    }


# --- build ------------------------------------------------------------------------------------


def build(out: Path, config: BuildConfig = BuildConfig()) -> dict:
    """Train tokenizer and model, measure them, and move the finished directory to `out`."""
    start = time.perf_counter()
    conversations = training_corpus(config.conversations, config.seed)
    tokenizer = train_tokenizer(conversations, config.vocab_size)
    samples = [encode(tokenizer, c) for c in conversations]
    too_long = [i for i, (ids, _) in enumerate(samples) if len(ids) > config.max_positions]
    if too_long:
        raise ValueError(
            f"{len(too_long)} corpus conversations exceed max_positions="
            f"{config.max_positions} (first: #{too_long[0]}); raise max_positions"
        )
    # transformers types its @wraps'd PreTrainedModel.to as taking `self` first
    model = build_model(tokenizer, config).to(config.device)  # type: ignore[arg-type]
    info = {"seed": config.seed, "steps": config.steps, **train(model, samples, config)}

    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        save(model, tokenizer, staging, config)
        info |= measure_saved(staging, config)
        info["build_seconds"] = round(time.perf_counter() - start, 1)
        (staging / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
        replace_directory(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # only left when something failed
    return info


def save(model: LlamaForCausalLM, tokenizer, directory: Path, config: BuildConfig) -> None:
    """A standard Hugging Face directory: weights in `config.dtype`, tokenizer with its template."""
    # transformers types its @wraps'd PreTrainedModel.to as taking `self` first
    model.to("cpu", getattr(torch, config.dtype))  # type: ignore[arg-type]
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
        max_new_tokens=config.max_new_tokens,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory, save_jinja_files=False)  # template in tokenizer_config


def measure_saved(directory: Path, config: BuildConfig) -> dict:
    """Load the directory back as the pipeline does (float32 compute on CPU) and measure it."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "config": asdict(config),
        "demo": measure(
            model.to(config.device),  # type: ignore[arg-type]  # HF's @wraps'd .to: stub wants self
            tokenizer,
            demo_conversations(config.demo_prompts),
            config.max_new_tokens,
        ),
    }


def replace_directory(staging: Path, out: Path) -> None:
    """Swap a finished directory into place; an existing `out` is removed only afterwards."""
    previous = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(previous)
    staging.rename(out)
    shutil.rmtree(previous, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write (replaced)")
    parser.add_argument("--steps", type=int, default=BuildConfig.steps)
    parser.add_argument("--seed", type=int, default=BuildConfig.seed)
    parser.add_argument(
        "--device",
        default=BuildConfig.device,
        help="cpu, or cuda to build faster (not bit-identical to a CPU build)",
    )
    args = parser.parse_args(argv)
    info = build(args.out, BuildConfig(seed=args.seed, steps=args.steps, device=args.device))
    print(json.dumps(info["demo"], indent=2))


if __name__ == "__main__":
    main()
