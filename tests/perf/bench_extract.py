"""How fast the extraction forward runs: `FeatureExtractor` over a randomly initialised Llama of a
given shape, in tokens/s and in achieved TFLOP/s against the dense bf16 peak.

    python -m tests.perf.bench_extract [--shape llama-3.1-8b|tiny] [--device auto|cpu|cuda]
        [--batches 1x2048 4x2048 8x2048] [--compile]

SpecForge's figures at these shapes, the goal (80% of the bf16 peak) and this script's own are in
docs/performance.md. FLOPs counted are
those the forward must do: 2 x decoder-layer weights per token (the embedding is a lookup and the
LM head never runs) plus causal attention, 2 x layers x T^2 x heads x head_dim per sequence.

The target shapes and the timing, memory and table helpers here are shared with bench_train.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections.abc import Callable

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from stages.capture.hooks import FeatureExtractor, compile_layers, decoder_parts
from stages.drafter.layers import default_aux_indices
from stages.runtime.device import resolve_device
from tests import mla_target

H200_BF16_DENSE_TFLOPS = 989.0
KIMI = mla_target.SHAPES["kimi-k2.5"]
KIMI_WIDTHS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)

SHAPES = {
    "llama-3.1-8b": dict(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        num_hidden_layers=32,
        rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    # Kimi-K2.5's widths (tests/mla_target.py) as a Llama config: what the draft layer is built
    # from (the draft of an MLA target has head_dim v_head_dim = 128 and as many kv heads as
    # heads; the target's vocabulary), at Kimi-K2.5's 61 layers.
    "kimi-k2.5": dict(
        {k: KIMI[k] for k in KIMI_WIDTHS},
        head_dim=KIMI["v_head_dim"],
        num_hidden_layers=61,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": KIMI["rope_theta"]},
    ),
    "tiny": dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=512,
        num_hidden_layers=8,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
}


def target_config(shape: str) -> LlamaConfig:
    return LlamaConfig(**SHAPES[shape])


def batch_shape(text: str) -> tuple[int, int]:
    """'4x2048' -> (4, 2048): batch x length."""
    try:
        batch, length = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write batch x length, e.g. 4x2048") from None
    if batch < 1 or length < 4:
        raise argparse.ArgumentTypeError(f"{text!r}: batch must be >= 1 and length >= 4")
    return batch, length


def common_arguments(parser: argparse.ArgumentParser, batches: list[str]) -> None:
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--batches",
        nargs="+",
        type=batch_shape,
        default=[batch_shape(b) for b in batches],
        help="batch x length list",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per batch shape")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per batch shape")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], device: torch.device, warmup: int, repeat: int
) -> float:
    """Median wall time of `fn` after `warmup` calls, the device synchronised around each."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float:
    """CUDA max allocated since the last reset; on CPU the process's max RSS (never reset)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def print_table(columns: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def build_target(shape: str, device: torch.device, dtype: torch.dtype):
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(target_config(shape), dtype=dtype)
    return model.eval()


def forward_flops(model, batch: int, length: int) -> float:
    """Matmul FLOPs of one forward over batch x length tokens (causal attention counted)."""
    cfg = model.config
    _, layers, _ = decoder_parts(model)
    weights = sum(p.numel() for p in layers.parameters() if p.dim() == 2)
    attention = 2 * cfg.num_hidden_layers * length**2 * cfg.num_attention_heads * cfg.head_dim
    return batch * (2 * weights * length + attention)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser, ["1x2048", "4x2048", "8x2048"])
    parser.add_argument(
        "--compile",
        action="store_true",
        help="time the forward with each decoder layer torch.compiled",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=H200_BF16_DENSE_TFLOPS,
        help="dense bf16 peak the achieved rate is a share of (H200: 989)",
    )
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = build_target(args.shape, device, dtype)
    layers = model.config.num_hidden_layers
    extractor = FeatureExtractor(model, default_aux_indices(layers))
    print(
        f"extraction forward: {args.shape} ({layers} layers, aux {extractor.aux_indices}), "
        f"{device}, {dtype}, median of {args.repeat} after {args.warmup} warm-up calls"
    )

    columns = [
        "variant",
        "batch",
        "length",
        "tokens/s",
        "ms/call",
        "TFLOP/s",
        f"% of {args.peak_tflops:g}",
        "peak GiB",
        "device",
        "dtype",
    ]
    variant = "compile" if args.compile else "eager"
    if args.compile:
        compile_layers(model, dynamic=False)  # one graph per batch shape
    rows = []
    for batch, length in args.batches:
        ids = torch.randint(model.config.vocab_size, (batch, length), device=device)
        mask = torch.ones_like(ids)
        reset_peak_memory(device)
        seconds = median_seconds(lambda: extractor(ids, mask), device, args.warmup, args.repeat)
        tflops = forward_flops(model, batch, length) / seconds / 1e12
        share = f"{100 * tflops / args.peak_tflops:.1f}" if device.type == "cuda" else "-"
        rows.append(
            [
                variant,
                str(batch),
                str(length),
                f"{batch * length / seconds:,.0f}",
                f"{1e3 * seconds:.1f}",
                f"{tflops:.4g}",
                share,
                f"{peak_memory_gib(device):.2f}",
                device.type,
                str(dtype).removeprefix("torch."),
            ]
        )
    print_table(columns, rows)


if __name__ == "__main__":
    main()
