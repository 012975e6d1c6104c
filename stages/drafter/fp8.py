"""FP8 products for the draft's linear layers (`train.fp8`, GPUs with FP8 tensor cores).

A linear layer's three products, y = x W^T, dx = dy W and dW = dy^T x, each take their two
operands in float8 e4m3 with one float32 scale per row along the product's inner dimension
(row-wise scaling: a row's largest magnitude maps to 448), accumulate in float32 and return
bf16. On an FP8 GPU these products run well above the bf16 rate (docs/performance.md). Written
without state, so that a compiled objective traces the quantisation into its graph and fuses it
with the producers and consumers around it.

Off a GPU the same quantised values are multiplied in float32: what the tests check.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max
ROWS_MULTIPLE = 16  # FP8 GEMMs take dimensions in multiples of 16


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [R, C] -> (q [R, C] e4m3, contiguous; scale [R, 1] float32) with x ~= q * scale."""
    x32 = x.float()
    # the maximum taken here, not from E4M3_MAX: a module-level float is unspecialised when
    # traced with dynamic shapes, and dynamo then failed on the second FP8Linear of a graph
    scale = x32.abs().amax(-1, keepdim=True).clamp(min=1e-12) / torch.finfo(E4M3).max
    return (x32 / scale).to(E4M3).contiguous(), scale


def scaled_product(a: Tensor, b: Tensor) -> Tensor:
    """a [M, K] @ b [N, K]^T in FP8, each operand quantised along K; bf16 [M, N]."""
    qa, scale_a = quantize_rows(a)
    qb, scale_b = quantize_rows(b)
    if a.is_cuda:
        return torch._scaled_mm(
            qa, qb.t(), scale_a=scale_a, scale_b=scale_b.view(1, -1), out_dtype=torch.bfloat16
        )
    return ((qa.float() * scale_a) @ (qb.float() * scale_b).t()).to(torch.bfloat16)


class FP8Linear(torch.autograd.Function):
    """x [M, K] (M a multiple of 16), weight [N, K] -> x W^T, every product in FP8."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        return scaled_product(x, weight)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = scaled_product(grad, weight.t())
        grad_w = scaled_product(grad.t(), x.t())
        return grad_x.to(x.dtype), grad_w.to(weight.dtype)


def fp8_linear(x: Tensor, weight: Tensor) -> Tensor:
    """F.linear(x, weight) (no bias) with its products in FP8; x [..., K] -> bf16 [..., N]. The
    rows are zero-padded to a multiple of 16 for the GEMMs (zero rows add nothing to dW)."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    out = FP8Linear.apply(F.pad(flat, (0, 0, 0, -rows % ROWS_MULTIPLE)), weight)
    return out[:rows].view(*x.shape[:-1], weight.shape[0])


def fp8_problem(device: torch.device, widths: dict[str, tuple[int, int]]) -> str | None:
    """Why FP8 training cannot run here, or None: every linear layer's widths (`widths`: name
    -> (in, out)) in multiples of 16, and a CUDA GPU of compute capability 8.9 or later."""
    odd = [f"{n} {i}x{o}" for n, (i, o) in widths.items() if i % 16 or o % 16]
    if odd:
        return "FP8 GEMMs need widths in multiples of 16; not: " + ", ".join(odd)
    if device.type != "cuda":
        return f"FP8 products need a CUDA GPU; this run trains on {device}"
    capability = torch.cuda.get_device_capability(device)
    if capability < (8, 9):
        return (
            f"FP8 products need compute capability 8.9 or later (Ada, Hopper); "
            f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}"
        )
    return None
