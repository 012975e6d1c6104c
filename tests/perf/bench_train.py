"""How fast a drafter's training step runs: the objective's forward (EAGLE-3's training-time test
over `ttt_steps`, or with `--family dflash` DFlash's blocks at dflash's default block size and
anchors), backward, gradient clipping and the AdamW step, on random features of a target shape.

    python -m tests.perf.bench_train [--family eagle3|dflash] [--shape llama-3.1-8b|kimi-k2.5|tiny]
        [--device auto|cpu|cuda] [--batches 1x2048 4x2048] [--ttt-steps 7]
        [--attention auto reference flex] [--check] [--tf32] [--compile] [--fp8]
        [--profile [ROWS]] [--json-out F]

`--attention` times each attention implementation in turn (auto: flex on a GPU); `--check`
then compares loss and gradients of the fast path with each of them (bf16 autocast on a GPU,
EAGLE-3's fused loss) against the plain float32 reference (no autocast,
EAGLE-3's materialised attention, DFlash's dense mask) on one fresh random batch per shape,
and prints the largest relative differences; it runs after every timing, as the reference's
float32 kernels count against the compiled kernels' recompile limit (past it the timed path
would run unfused). `--compile` times
the objective compiled as one graph, as `train.compile` runs it (the dtype column says
"compiled"; the first step compiles it: `first step s`, counted among the warm-up steps and
never in the rate). `--fp8` runs the drafter's linear products in FP8,
as `train.fp8` does (with `--check`, the fast path includes them; emulated on the CPU); `--curve
N` then trains N steps without and with FP8 (bf16 / FP8 on a GPU; compiled with `--compile`) on
learnable batches and prints both loss curves. A shape that does not fit prints OOM.

The inputs are what the train stage gives the step: a float32 drafter (the optimizer's master
weights), the target embedding and LM head in their stored dtype (bf16 on a GPU, float32 on the
CPU: `Objective.place`), collated features (bf16 as stored on a GPU, float32 on the CPU), bf16
autocast on a GPU, fused AdamW there. `labels ms` times EAGLE-3's soft labels alone
(`soft_labels`, part of every step). SpecForge's figures on the same GPU: docs/performance.md.
`--ttt-steps`, `--curve` and `labels ms` are EAGLE-3's; `--attention`, `--check` and `--fp8`
take either family.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from stages.dflash.model import DFlashConfig, DFlashDrafter
from stages.dflash.objective import DFlashObjective
from stages.drafter.fp8 import fp8_problem
from stages.drafter.layers import default_aux_indices
from stages.drafter.model import Eagle3Config, Eagle3Drafter, use_fp8
from stages.drafter.objective import LoopObjective
from stages.drafter.training import (
    Objective,
    adamw,
    autocast_for,
    compiled_objective,
    feature_dtype,
    training_step,
)
from stages.drafter.ttt import soft_labels
from stages.params.dflash import DFlashParams
from stages.runtime.device import resolve_device
from tests.perf.bench_extract import (
    common_arguments,
    median_seconds,
    peak_memory_gib,
    print_table,
    reset_peak_memory,
    synchronize,
    target_config,
)

DRAFT_VOCAB = {"llama-3.1-8b": 32000, "kimi-k2.5": 32000, "tiny": 128}


def build_objective(shape: str, ttt_steps: int, decay: float, device: torch.device) -> Objective:
    """A fresh drafter over random frozen target embedding / LM head, as stages.train builds it."""
    target = target_config(shape)
    cfg = Eagle3Config.from_target(
        target, DRAFT_VOCAB[shape], default_aux_indices(target.num_hidden_layers)
    )
    with torch.device(device):
        drafter = Eagle3Drafter(cfg)
    return Objective(drafter, *random_target(target, device), ttt_steps, decay).place(device)


def build_dflash_objective(shape: str, device: torch.device) -> DFlashObjective:
    """A fresh DFlash drafter at dflash's defaults (block size, layers, anchors, decay) over random
    frozen target embedding / LM head, as stages.train_dflash builds it."""
    target, defaults = target_config(shape), DFlashParams()
    cfg = DFlashConfig.from_target(
        target,
        num_hidden_layers=defaults.num_layers,
        block_size=defaults.block_size,
        mask_token_id=target.vocab_size - 1,  # a random target's: any id generation never sees
    )
    with torch.device(device):
        drafter = DFlashDrafter(cfg)
    embed, head = random_target(target, device)
    objective = DFlashObjective(drafter, embed, head, defaults.num_anchors, defaults.decay_gamma)
    return objective.place(device)


def random_target(target, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target embedding and LM head, random, in the dtype the target stores them
    (bf16; float32 on the CPU, as the features)."""
    stored = feature_dtype(device) or torch.bfloat16
    with torch.device(device):
        embed = (0.02 * torch.randn(target.vocab_size, target.hidden_size)).to(stored)
        head = (0.02 * torch.randn(target.vocab_size, target.hidden_size)).to(stored)
    return embed, head


def random_batch(
    objective: LoopObjective, batch: int, length: int, device: torch.device
) -> dict[str, torch.Tensor]:
    """A collated batch as the training loop gives it (features bf16 on GPU, as stored; fp32 on
    CPU: stages.drafter.training.feature_dtype), every position supervised."""
    cfg, dtype = objective.drafter.cfg, feature_dtype(device) or torch.bfloat16
    with torch.device(device):
        return {
            # the features both families' `fc` reads: EAGLE-3's aux layers or DFlash's
            "aux": torch.randn(batch, length, objective.drafter.fc.in_features, dtype=dtype),
            "last": torch.randn(batch, length, cfg.target_hidden_size, dtype=dtype),
            "input_ids": torch.randint(cfg.vocab_size, (batch, length)),
            "loss_mask": torch.ones(batch, length, dtype=torch.bool),
            "attention_mask": torch.ones(batch, length, dtype=torch.bool),
        }


def print_profile(fn, device: torch.device, rows: int) -> None:
    """The `rows` operators of one call of `fn` with the most self time on the device (CPU time
    on CPU)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        synchronize(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(parser, ["1x2048", "4x2048"])
    parser.add_argument("--family", choices=["eagle3", "dflash"], default="eagle3")
    parser.add_argument("--ttt-steps", type=int, default=7)
    parser.add_argument("--decay", type=float, default=0.8)
    parser.add_argument(
        "--tf32", action="store_true", help="let float32 matmuls (the target-label matmul) use TF32"
    )
    parser.add_argument(
        "--compile", action="store_true", help="the objective compiled (train.compile)"
    )
    parser.add_argument("--fp8", action="store_true", help="linear products in FP8 (train.fp8)")
    parser.add_argument(
        "--profile",
        type=int,
        nargs="?",
        const=20,
        metavar="ROWS",
        help="after timing, print the ROWS (default 20) kernels of one step with most device time",
    )
    parser.add_argument(
        "--attention", nargs="+", default=["auto"], choices=["auto", "reference", "flex"]
    )
    parser.add_argument(
        "--check", action="store_true", help="each --attention vs float32 reference: loss, grads"
    )
    parser.add_argument(
        "--curve",
        type=int,
        metavar="STEPS",
        help="then train a fresh drafter STEPS steps without and with FP8 on the same learnable "
        "batches (the first --batches shape; compiled with --compile) and print both loss curves",
    )
    parser.add_argument("--json-out", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    eagle3 = args.family == "eagle3"
    if not eagle3 and args.curve:
        parser.error("--curve trains EAGLE-3's drafters; leave it out with dflash")

    device = resolve_device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    dtype = "bf16 autocast" if device.type == "cuda" else "fp32"
    dtype += " tf32" if args.tf32 else ""
    dtype += " compiled" if args.compile else ""
    dtype += " fp8" if args.fp8 else ""
    columns = ["batch", "length", "attention", "tokens/s", "ms/step", "first step s", "labels ms"]
    columns += ["peak GiB", "device", "dtype", "ttt_steps"]
    rows, records = [], []
    torch.manual_seed(0)
    objective = (
        build_objective(args.shape, args.ttt_steps, args.decay, device)
        if eagle3
        else build_dflash_objective(args.shape, device)
    )
    drafter = objective.drafter
    widths = use_fp8(drafter, args.fp8)
    if args.fp8 and device.type == "cuda" and (problem := fp8_problem(device, widths)):
        parser.error(f"--fp8: {problem}")  # on the CPU: emulated (quantised values, fp32 GEMMs)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = adamw(params, 1e-4, 0.0, device)
    autocast = autocast_for(device)
    what = (
        f"draft vocab {drafter.cfg.draft_vocab_size:,}"
        if eagle3
        else f"blocks of {drafter.cfg.block_size}, {objective.num_anchors} anchors a sample"
    )
    print(
        f"training step: {args.shape} {args.family} drafter ({sum(p.numel() for p in params):,} "
        f"parameters, {what}), {device}, {dtype}, "
        f"median of {args.repeat} after {args.warmup} warm-up steps"
    )

    model = compiled_objective(objective) if args.compile else objective

    def step(batch: dict[str, torch.Tensor]) -> None:
        training_step(model, batch, params, opt, 1.0, autocast)

    for batch_size, length in args.batches:
        batch = random_batch(objective, batch_size, length, device)
        for impl in args.attention:
            set_attention(objective, impl)
            record = {"batch": batch_size, "length": length, "attention": impl}
            shape = [str(batch_size), str(length), impl]
            try:
                reset_peak_memory(device)
                print(f"{batch_size}x{length} {impl}: first step", file=sys.stderr, flush=True)
                first = median_seconds(lambda: step(batch), device, 0, 1)  # compiles, --compile
                warmup = max(args.warmup - 1, 0)
                seconds = median_seconds(lambda: step(batch), device, warmup, args.repeat)
                peak = peak_memory_gib(device)
                labels = eagle3 and median_seconds(
                    lambda: soft_labels(batch["last"], drafter, objective.lm_head),
                    device,
                    1,
                    args.repeat,
                )
            except torch.OutOfMemoryError:
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                rows.append([*shape, "OOM", "", "", "", "", device.type, dtype])
                rows[-1].append(str(args.ttt_steps))
                records.append({**record, "oom": True})
                continue
            record |= {
                "tokens_per_s": round(batch_size * length / seconds, 1),
                "ms_per_step": round(1e3 * seconds, 2),
                "first_step_s": round(first, 2),
                "peak_gib": round(peak, 2),
            }
            records.append(record)
            rows.append(
                [
                    *shape,
                    f"{batch_size * length / seconds:,.0f}",
                    f"{1e3 * seconds:.1f}",
                    f"{first:.1f}",
                    f"{1e3 * labels:.1f}" if eagle3 else "-",
                    f"{peak:.2f}",
                    device.type,
                    dtype,
                    str(args.ttt_steps) if eagle3 else "-",
                ]
            )
            progress = "  ".join(f"{c} {v}" for c, v in zip(columns, rows[-1]))
            print(progress, file=sys.stderr, flush=True)  # the table comes at the end
            if args.profile:
                print_profile(lambda: step(batch), device, args.profile)
        del batch
    print_table(columns, rows)
    if args.check:  # after the timings: the float32 reference compiles kernels of its own
        for batch_size, length in args.batches:
            batch = random_batch(objective, batch_size, length, device)  # one for every path
            for impl in args.attention:
                try:
                    check = compare_with_reference(objective, batch, args.fp8, model, impl)
                except torch.OutOfMemoryError:
                    objective.drafter.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    check = "OOM (the reference does not fit)"
                print(f"{batch_size}x{length} {impl} vs float32 reference: {check}")
    if args.curve:
        del model, objective, drafter, params, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
        batch_size, length = args.batches[0]
        curves = loss_curves(args, device, batch_size, length)
        tail = every = max(1, args.curve // 10)  # a tenth: printed stride, and the compared tail
        print(f"loss every {every} steps, {batch_size}x{length}, lr 3e-4:")
        for name, losses in curves.items():
            print(f"  {name:5s} " + " ".join(f"{x:.3f}" for x in losses[every - 1 :: every]))
        (base, base_curve), (_, fp8_curve) = curves.items()
        base_mean, fp8_mean = (sum(c[-tail:]) / tail for c in (base_curve, fp8_curve))
        print(
            f"mean of the last {tail} steps: {base} {base_mean:.4f}, fp8 {fp8_mean:.4f} "
            f"({(fp8_mean - base_mean) / base_mean:+.2%}); first step {base_curve[0]:.4f}"
        )
        records.append({"curves": curves})
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"shape": args.shape, "device": str(device), "rows": records}, f, indent=1)


def loss_curves(args, device: torch.device, batch_size: int, length: int) -> dict:
    """The losses of the same fresh drafter trained without and with FP8 on the same stream of
    learnable batches; compiled with --compile (eager FP8 is slow: 231 ms a step at 1 x 2048)."""
    curves = {}
    for name in ("bf16" if device.type == "cuda" else "fp32", "fp8"):
        torch.manual_seed(0)
        objective = build_objective(args.shape, args.ttt_steps, args.decay, device)
        use_fp8(objective.drafter, name == "fp8")
        params = [p for p in objective.drafter.parameters() if p.requires_grad]
        opt = adamw(params, 3e-4, 0.0, device)
        model = compiled_objective(objective) if args.compile else objective
        g = torch.Generator(device).manual_seed(1)
        losses = []
        for _ in range(args.curve):
            batch = learnable_batch(objective, batch_size, length, g)
            loss, _, _ = training_step(model, batch, params, opt, 0.5, autocast_for(device))
            losses.append(loss.item())
        curves[name] = losses
        del objective, params, opt
    return curves


def learnable_batch(
    objective: Objective, batch: int, length: int, g: torch.Generator
) -> dict[str, torch.Tensor]:
    """Features a draft can learn from: the target's last hidden state a moving average of 16
    positions of noise (so position i + 1 is mostly known at i), its aux features that state
    plus noise, the tokens the target's head picks from it; every position supervised."""
    cfg, device = objective.drafter.cfg, objective.embed.device
    dtype = feature_dtype(device) or torch.bfloat16
    width = cfg.target_hidden_size
    noise = torch.randn(batch, width, length + 15, generator=g, device=device)
    last = 4 * F.avg_pool1d(noise, 16, stride=1).transpose(1, 2)
    aux = last.repeat(1, 1, cfg.num_aux)
    aux = aux + 0.1 * torch.randn(aux.shape, generator=g, device=device)
    ids = (last.to(objective.lm_head.dtype) @ objective.lm_head.T).argmax(-1)
    ones = torch.ones(batch, length, dtype=torch.bool, device=device)
    return {
        "aux": aux.to(dtype),
        "last": last.to(dtype),
        "input_ids": ids,
        "loss_mask": ones,
        "attention_mask": ones,
    }


def set_attention(objective: LoopObjective, impl: str) -> None:
    """The draft attention forced to `impl` (EAGLE-3's `Attention.impl`, DFlash's
    `BlockAttention.impl`)."""
    for module in objective.drafter.modules():
        if hasattr(module, "impl"):
            module.impl = impl


def compare_with_reference(
    objective: LoopObjective,
    batch: dict[str, torch.Tensor],
    fp8: bool = False,
    fast=None,
    impl: str = "auto",
) -> str:
    """Loss and gradients of one forward/backward on the same weights and batch: the fast path
    as timed (`fast`, the compiled objective with --compile, else `objective`; bf16 autocast on a
    GPU, attention `impl`, EAGLE-3's fused loss) against the plain reference (`objective` in
    float32, no autocast, EAGLE-3's materialised attention, DFlash's dense mask), both reading
    the same target hidden state and drawing the same DFlash anchors:
    the largest relative difference of the loss and of any parameter's gradient (norm of the
    difference over the reference's norm). The compiled path is
    checked through the graph already compiled for the timings, and the reference runs every
    part a GPU compiles (norms, rope, the loss's rows) as written, so the check compiles nothing
    (in float32 they would each compile again)."""
    device = batch["aux"].device.type
    # the reference reads the features in float32 (DFlash's fc takes them as they come); the
    # target's final hidden state stays as stored, so that both paths take EAGLE-3's soft labels
    # from the same target logits: rounded differently, they flip near-tied argmaxes (which
    # positions count), which moves the gradients far more than the paths' own arithmetic
    float_features = {k: v.float() if k == "aux" else v for k, v in batch.items()}
    paths = {  # (model, batch, attention, autocast, compiled parts: as compiled, or as written)
        "reference": (
            objective,
            float_features,
            "reference",
            lambda: torch.autocast(device, enabled=False),
            "force_eager",
        ),
        "fast": (
            objective if fast is None else fast,
            batch,
            impl,
            autocast_for(batch["aux"].device),
            "default",
        ),
    }
    results, draws = {}, objective.loop_state()  # DFlash's anchors: both paths draw the same
    for name, (model, inputs, impl, autocast, stance) in paths.items():
        objective.load_loop_state(draws)
        set_attention(objective, impl)
        use_fp8(objective.drafter, fp8 and name == "fast")
        objective.drafter.zero_grad(set_to_none=True)
        with torch.compiler.set_stance(stance):
            with autocast():
                loss, _ = model(inputs)
            loss.backward()
        grads = {
            n: p.grad.float().clone()
            for n, p in objective.drafter.named_parameters()
            if p.grad is not None
        }
        results[name] = (loss.detach().float(), grads)
    objective.drafter.zero_grad(set_to_none=True)
    set_attention(objective, "auto")
    use_fp8(objective.drafter, fp8)
    (ref_loss, ref), (fast_loss, fast) = results["reference"], results["fast"]
    loss_diff = ((fast_loss - ref_loss).abs() / ref_loss.abs()).item()
    worst = max(ref, key=lambda n: (fast[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-12))
    grad_diff = ((fast[worst] - ref[worst]).norm() / ref[worst].norm().clamp_min(1e-12)).item()
    return f"loss rel diff {loss_diff:.2e}, largest grad rel diff (norm) {grad_diff:.2e} ({worst})"


if __name__ == "__main__":
    main()
