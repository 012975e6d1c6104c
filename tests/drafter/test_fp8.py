"""`train.fp8`: the drafter's linear products in FP8 e4m3 with row-wise scales. On the CPU the
same quantised values are multiplied in float32 (a GPU runs torch._scaled_mm on them)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.drafter.fp8 import E4M3_MAX, fp8_linear, fp8_problem, quantize_rows
from stages.drafter.layers import default_aux_indices
from stages.drafter.model import Eagle3Config, Eagle3Drafter, Linear, use_fp8
from stages.drafter.training import LoopSettings, Objective, train
from stages.drafter.ttt import ttt_forward

from .conftest import LAYERS, features, make_drafter

# e4m3 keeps 3 mantissa bits: a normal value rounds to within half a step, 2**-4 of itself
# (relative); values far below their row's largest fall to subnormals and lose more.
E4M3_ROUNDING = 2.0**-4


def test_each_row_scales_its_largest_magnitude_to_the_e4m3_maximum():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 64, generator=g) * torch.tensor([1e-3, 1.0, 10.0, 300.0, 1e4])[:, None]
    q, scale = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (5, 1) and q.is_contiguous()
    torch.testing.assert_close(q.float().abs().amax(-1), torch.full((5,), E4M3_MAX))
    back = q.float() * scale
    normal = x.abs() > scale * 2.0**-6  # e4m3's smallest normal, in the row's units
    assert ((back - x).abs() <= E4M3_ROUNDING * x.abs() * (1 + 1e-6))[normal].all()
    assert ((back - x).abs() > 0).any()  # rounded: 64 random floats do not all fit 3 bits


def test_a_transposed_operand_is_quantised_along_its_own_rows():
    """dW = dy^T x quantises dy and x along the token dimension: a transposed view must come out
    contiguous, one scale per row of the view."""
    x = torch.randn(48, 32)
    q, scale = quantize_rows(x.t())
    assert q.shape == (32, 48) and q.is_contiguous() and scale.shape == (32, 1)
    torch.testing.assert_close(scale.flatten(), x.abs().amax(0) / E4M3_MAX)


@pytest.mark.parametrize("rows", [16, 21, 3])
def test_the_fp8_linear_and_its_gradients_follow_the_float32_product(rows):
    """Forward, dx and dW within the error FP8 operands make (a few per cent of the norm),
    however many rows (padded to 16 for the GEMMs, the padding adding nothing to dW)."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(2, rows, 64, generator=g, requires_grad=True)
    w = (0.1 * torch.randn(48, 64, generator=g)).requires_grad_(True)
    grad_out = torch.randn(2, rows, 48, generator=g)
    y = fp8_linear(x, w)
    assert y.shape == (2, rows, 48) and y.dtype == torch.bfloat16
    dx, dw = torch.autograd.grad(y.float(), (x, w), grad_out)
    ref = F.linear(x, w)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x, w), grad_out)
    for got, want in ((y.float(), ref), (dx, ref_dx), (dw, ref_dw)):
        rel = ((got - want).norm() / want.norm()).item()
        assert 1e-4 < rel < 0.06, rel  # quantised (not exact), and close
    assert dx.dtype == x.dtype and dw.dtype == w.dtype


def test_padded_rows_change_nothing():
    """The same rows with and without 13 zero rows after them: equal outputs and dW."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(19, 32, generator=g)
    w = torch.randn(16, 32, generator=g, requires_grad=True)
    y = fp8_linear(x, w)
    (dw,) = torch.autograd.grad(y.float().sum(), w)
    padded = torch.cat([x, torch.zeros(13, 32)])
    y_padded = fp8_linear(padded, w)
    (dw_padded,) = torch.autograd.grad(y_padded[:19].float().sum(), w)
    torch.testing.assert_close(y_padded[:19], y)
    torch.testing.assert_close(dw_padded, dw)


@pytest.mark.slow
def test_layers_of_fp8_products_compile_with_dynamic_lengths():
    """Two FP8 layers in a row, compiled with symbolic lengths (as the objective is after its
    second batch shape) at two lengths: the same output and gradients as eager. With the e4m3
    maximum read from a module-level float, dynamo (torch 2.11-2.13) failed here, tracing the
    second layer's Function: `lift_tracked_freevar_to_input should not be called on root
    SubgraphTracer` (pytorch/pytorch#193194)."""
    g = torch.Generator().manual_seed(5)
    w1 = torch.randn(32, 48, generator=g, requires_grad=True)
    w2 = torch.randn(16, 32, generator=g, requires_grad=True)

    def loss(x):
        return fp8_linear(fp8_linear(x, w1).float(), w2).float().square().mean()

    torch._dynamo.reset()
    compiled = torch.compile(loss, dynamic=True, backend="aot_eager")
    for length in (40, 70):
        x = torch.randn(2, length, 48, generator=g)
        got = compiled(x), *torch.autograd.grad(compiled(x), (w1, w2))
        want = loss(x), *torch.autograd.grad(loss(x), (w1, w2))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


def test_the_drafter_switches_every_linear_layer(target_config):
    drafter = make_drafter(target_config)
    widths = drafter.use_fp8(True)
    linears = [n for n, m in drafter.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(widths) == sorted(linears) and len(linears) == 9
    assert all(m.fp8 for m in drafter.modules() if isinstance(m, Linear))
    assert widths["midlayer.mlp.down_proj"] == (
        drafter.cfg.intermediate_size,
        drafter.cfg.hidden_size,
    )
    drafter.use_fp8(False)
    assert not any(m.fp8 for m in drafter.modules() if isinstance(m, Linear))


def test_the_training_loss_and_gradients_in_fp8_stay_near_float32(target, target_config):
    """The whole TTT objective: loss within 1%, every parameter's gradient within 25% of its
    norm (FP8 rounds every operand of every product, 7 steps deep), and not equal (FP8 ran)."""
    drafter = make_drafter(target_config)
    ids = torch.randint(
        0, target_config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(4)
    )
    aux, logits = features(target, ids, drafter.cfg.aux_layer_ids)
    mask = torch.ones_like(ids)
    assert_fp8_near_float32(
        drafter,
        lambda: ttt_forward(
            drafter, target.model.embed_tokens, aux, logits, ids, mask, ttt_steps=3
        )[0],
    )


def assert_fp8_near_float32(drafter, loss_of) -> None:
    """`loss_of()` with the drafter's products in float32, then in FP8: the loss within 1%, every
    parameter's gradient within 25% of its norm, and not equal (FP8 ran)."""
    results = {}
    for fp8 in (False, True):
        use_fp8(drafter, fp8)
        drafter.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        results[fp8] = loss.item(), {n: p.grad.clone() for n, p in drafter.named_parameters()}
    (ref_loss, ref), (loss, grads) = results[False], results[True]
    assert loss == pytest.approx(ref_loss, rel=1e-2) and loss != ref_loss
    for name, want in ref.items():
        rel = ((grads[name] - want).norm() / want.norm()).item()
        assert rel < 0.25, (name, rel)


def test_fp8_needs_widths_in_sixteens_and_a_gpu_with_fp8_tensor_cores(target_config):
    cfg = Eagle3Config.from_target(_config(hidden=40), 64, default_aux_indices(LAYERS))
    problem = fp8_problem(torch.device("cpu"), Eagle3Drafter(cfg).use_fp8(False))
    assert problem is not None and "multiples of 16" in problem
    assert "fc 120x40" in problem and "midlayer.self_attn.q_proj 80x40" in problem
    good = make_drafter(target_config, draft_vocab=128).use_fp8(False)
    assert fp8_problem(torch.device("cpu"), good) == (
        "FP8 products need a CUDA GPU; this run trains on cpu"
    )


def test_training_with_fp8_off_a_gpu_is_refused_naming_the_setting(target, target_config, tmp_path):
    drafter = make_drafter(target_config, draft_vocab=128)
    objective = Objective(drafter, target.model.embed_tokens.weight, target.lm_head.weight, 2, 0.8)
    settings = LoopSettings(
        ttt_steps=2, decay=0.8, total_steps=1, batch_size=1, lr=1e-3, min_lr_ratio=0.1,
        warmup_steps=1, weight_decay=0.0, grad_clip=0.5, eval_every=1, eval_num_steps=1,
        eval_max_samples=1, checkpoint_every=1, seed=0, fp8=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^fp8: FP8 products need a CUDA GPU.*set it to false"):
        train(objective, None, None, settings, tmp_path, torch.device("cpu"))  # type: ignore[arg-type]


def test_fp8_without_compile_is_refused(target, target_config, tmp_path, monkeypatch):
    """Eager FP8 is slower than bf16 (its quantisation as separate kernels): a run asking for it
    uncompiled is told so, even where the GPU could run it."""
    from stages.drafter import training

    monkeypatch.setattr(training, "fp8_problem", lambda device, widths: None)
    drafter = make_drafter(target_config, draft_vocab=128)
    objective = Objective(drafter, target.model.embed_tokens.weight, target.lm_head.weight, 2, 0.8)
    settings = LoopSettings(
        ttt_steps=2, decay=0.8, total_steps=1, batch_size=1, lr=1e-3, min_lr_ratio=0.1,
        warmup_steps=1, weight_decay=0.0, grad_clip=0.5, eval_every=1, eval_num_steps=1,
        eval_max_samples=1, checkpoint_every=1, seed=0, fp8=True, compile=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"^fp8: runs compiled only \(set compile: true\)"):
        train(objective, None, None, settings, tmp_path, torch.device("cpu"))  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_compiled_objective_traces_the_fp8_products_into_its_graph(
    target, target_config, compile_without_codegen
):
    """Traced and compiled as a GPU compiles it (short of the kernels): the FP8 products
    (quantisation, products, both gradients) inside the objective's graph with no break, one
    static graph and one dynamic for every other length; loss as eager FP8 gives it. Gradients
    match eager FP8 only loosely: a compiled quantisation may round a few borderline values to
    the neighbouring e4m3 step."""
    from .test_compiled_objective import eager_and_compiled

    drafter = make_drafter(target_config, draft_vocab=128).train()
    drafter.use_fp8(True)
    for (want_loss, _, want_grads), (got_loss, _, got_grads) in eager_and_compiled(target, drafter):
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-3, atol=0)
        for name, want in want_grads.items():
            assert (got_grads[name] - want).norm() / want.norm() < 0.15, name


def _config(hidden: int):
    from .conftest import tiny_target_config

    return tiny_target_config(hidden_size=hidden, num_attention_heads=4, head_dim=10)
