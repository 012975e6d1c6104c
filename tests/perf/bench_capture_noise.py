"""The capture's numeric noise floor: how far the features of the same samples move when nothing
but the arithmetic changes, and where the difference comes from.

    python -m tests.perf.bench_capture_noise [--shape llama-3.1-8b|tiny | --target DIR]
        [--samples 4] [--lengths 1024 2048] [--device auto] [--seed 0] [--json-out FILE]

The same random samples (token ids) run through one target in several ways, each the hf
capture engine's way of running it or a step towards it:

- `fp32`: float32, each sample alone, the model's own attention (sdpa): the arithmetic's truth;
- `bf16`: bfloat16, each sample alone, sdpa (bench_extract_stage's reference);
- `packed alone`: bfloat16, each sample alone through the packed-rows attention the stage uses;
- `packed`: the samples packed into one row, in order (what the stage runs);
- `packed reordered`: the same samples packed in the reverse order: two runs that differ only in
  the batch's composition, the floor a canary comparing two correct captures sees;
- `packed compiled` (GPU): `packed` with each decoder layer compiled, as extract.compile does.

Then the canary's own measure (stages/capture/comparison.py, relative error over all the samples'
tokens): its floor, the bf16 reference run alone and in one right-padded batch, and the stage's
path (compiled where it compiles) against the reference alone, with their ratio: the margin a
threshold of FLOOR_MARGIN x the floor must cover.

For each pair it prints the largest relative error ||a - b|| / ||b|| over the samples, per
captured slot (each aux index, and `last`, the post-norm final state), and, bf16 against fp32
for the first sample, at every hidden-state index, to show how rounding grows with depth.
`--target DIR` runs a local checkpoint (e.g. the committed demo target, a trained model) instead
of random weights of `--shape`.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from stages.capture.comparison import FLOOR_MARGIN, floors, hf_reference, relative_error
from stages.capture.hf import HFCapture
from stages.capture.hooks import FeatureExtractor
from stages.drafter.layers import default_aux_indices
from tests.perf.bench_extract import build_target, print_table

Features = list[tuple[torch.Tensor, torch.Tensor]]  # per sample (aux [T, k*H], last [T, H])


def load(args, device: torch.device):
    """The target in float32 on `device` (random weights of --shape, or --target)."""
    if args.target:
        model = AutoModelForCausalLM.from_pretrained(
            args.target, dtype=torch.float32, local_files_only=True
        )
        return model.to(device).eval()
    torch.manual_seed(args.seed)
    return build_target(args.shape, device, torch.float32)


def alone(model, indices: list[int], samples: list[list[int]], device) -> Features:
    extractor = FeatureExtractor(model, indices)
    out = []
    with torch.no_grad():
        for ids in samples:
            x = torch.tensor([ids], device=device)
            aux, last = extractor(x, torch.ones_like(x))
            out.append((aux[0].float().cpu(), last[0].float().cpu()))
    return out


def captured(capture: HFCapture, samples: list[list[int]], order: list[int]) -> Features:
    got: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        for pos, aux, last in capture.capture([samples[i] for i in order]):
            got[order[pos]] = (aux.float().cpu(), last.float().cpu())
    return [got[i] for i in range(len(samples))]


def errors(a: Features, b: Features, k: int) -> list[float]:
    """Largest ||a - b|| / ||b|| over samples, per slot: the k aux layers, then last."""
    worst = [0.0] * (k + 1)
    for (aux_a, last_a), (aux_b, last_b) in zip(a, b):
        slots_a = list(aux_a.chunk(k, dim=-1)) + [last_a]
        slots_b = list(aux_b.chunk(k, dim=-1)) + [last_b]
        for j, (x, y) in enumerate(zip(slots_a, slots_b)):
            worst[j] = max(worst[j], float((x - y).norm() / y.norm()))
    return worst


def canary_reference(model16, indices: list[int], samples: list[list[int]]) -> dict:
    """The canary's hf reference (alone) and its floor per slot (a padded batch against it), run
    before the stage's capture switches the model to packed attention."""
    reference, ref_last = hf_reference(model16, samples, indices)
    rebatched, re_last = hf_reference(model16, samples, indices, batched=True)
    exact, ex_last = hf_reference(copy.deepcopy(model16).float(), samples, indices)
    ref = {**reference, "last": ref_last}
    others = [{**rebatched, "last": re_last}, {**exact, "last": ex_last}]
    return {"ref": ref, "floor": floors(ref, others, torch.bfloat16)}


def canary_view(reference: dict, indices: list[int], stage: Features) -> dict:
    """The canary's floor per slot, the stage's error against its reference, and their ratio."""
    keys, ref, floor = [*indices, "last"], reference["ref"], reference["floor"]
    aux = torch.cat([a for a, _ in stage]).chunk(len(indices), dim=-1)
    got = {**dict(zip(indices, aux)), "last": torch.cat([h for _, h in stage])}
    error = {k: relative_error(got[k], ref[k]) for k in keys}
    return {
        "floor": [floor[k] for k in keys],
        "stage": [error[k] for k in keys],
        "ratio": [error[k] / floor[k] if floor[k] else float("inf") for k in keys],
    }


def depth_profile(model32, model16, ids: list[int], device) -> list[float]:
    """bf16 against fp32, every hidden-state index of one sample (sdpa, alone)."""
    x = torch.tensor([ids], device=device)
    with torch.no_grad():
        h32 = model32(input_ids=x, output_hidden_states=True).hidden_states
        h16 = model16(input_ids=x, output_hidden_states=True).hidden_states
    return [float((b.float() - a).norm() / a.norm()) for a, b in zip(h32, h16)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-3.1-8b", help="random weights of this shape")
    parser.add_argument("--target", type=Path, help="a local checkpoint instead of --shape")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs=2, default=[1024, 2048])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(auto if args.device == "auto" else args.device)

    model32 = load(args, device)
    cfg = model32.config
    indices = default_aux_indices(cfg.num_hidden_layers)
    g = torch.Generator().manual_seed(args.seed)
    lengths = torch.randint(args.lengths[0], args.lengths[1] + 1, (args.samples,), generator=g)
    samples = [torch.randint(0, cfg.vocab_size, (int(n),), generator=g).tolist() for n in lengths]
    order, reverse = list(range(len(samples))), list(reversed(range(len(samples))))
    row = int(sum(lengths))
    k = len(indices)

    runs: dict[str, Features] = {"fp32": alone(model32, indices, samples, device)}
    model16 = load(args, device).to(torch.bfloat16)  # the same weights, rounded
    profile = depth_profile(model32, model16, samples[0], device)
    del model32
    runs["bf16"] = alone(model16, indices, samples, device)
    reference = canary_reference(model16, indices, samples)
    capture = HFCapture(model16, indices, torch.bfloat16, row)  # switches to packed attention
    runs["packed alone"] = [captured(capture, [s], [0])[0] for s in samples]
    runs["packed"] = captured(capture, samples, order)
    runs["packed reordered"] = captured(capture, samples, reverse)
    if device.type == "cuda":
        compiled = HFCapture(model16, indices, torch.bfloat16, row, compile=True)
        runs["packed compiled"] = captured(compiled, samples, order)

    pairs = [
        ("bf16", "fp32", "bf16 rounding (alone, sdpa)"),
        ("packed alone", "bf16", "packed-rows attention kernel"),
        ("packed", "packed alone", "packing (other samples in the row)"),
        ("packed reordered", "packed", "batch composition only: the floor"),
        ("packed", "bf16", "the stage's eager path against the bench reference"),
    ]
    if "packed compiled" in runs:
        pairs += [
            ("packed compiled", "packed", "compiled layers"),
            ("packed compiled", "bf16", "the stage (compiled) against the bench reference"),
        ]
    slots = [f"aux {i}" for i in indices] + ["last"]
    table = {what: errors(runs[a], runs[b], k) for a, b, what in pairs}
    print(
        f"[noise] {args.target or args.shape} ({cfg.num_hidden_layers} layers, hidden "
        f"{cfg.hidden_size}), {len(samples)} samples of {lengths.tolist()} tokens on {device}"
    )
    print_table(["what differs", *slots], [[w, *(f"{e:.2e}" for e in v)] for w, v in table.items()])
    canary = canary_view(reference, indices, runs.get("packed compiled", runs["packed"]))
    print(f"[noise] the canary's measure, over all tokens (threshold: {FLOOR_MARGIN:g} x floor)")
    names = {
        "floor": "floor: the reference batched, in float32, stored in bf16",
        "stage": "the stage's path against the reference alone",
        "ratio": "stage / floor",
    }
    print_table(
        ["canary", *slots], [[names[k], *(f"{e:.2e}" for e in v)] for k, v in canary.items()]
    )
    print("[noise] bf16 against fp32 by hidden-state index (sample 0, alone, sdpa):")
    print("  " + "  ".join(f"{i}:{e:.1e}" for i, e in enumerate(profile)))
    result = {
        "target": str(args.target or args.shape),
        "device": str(device),
        "lengths": lengths.tolist(),
        "aux_indices": indices,
        "slots": slots,
        "errors": table,
        "canary": canary,
        "bf16_vs_fp32_by_index": profile,
    }
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
