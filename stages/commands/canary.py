"""`python -m stages.commands.canary --merged data/merged --samples 8`: capture a few merged
samples with the configured extraction engine and compare them, layer by layer, with a second
source before committing a node to the whole extraction. Run it the way extraction runs (under
`torchrun --nproc-per-node <tp_size>` for the sglang engine).

Not a DVC stage: a check run by hand next to `dvc repro`, like `stages.commands.estimate`. Reads
params `target` and `extract` (engine, layers, dtype, sglang, canary). The second source
(`extract.canary.reference`):
- `hf`: the target in transformers on `extract.canary.hf_device` (a target that fits), with the
  layers next to each recorded one, so a capture shifted by one layer is named as such;
  `--reference-path DIR` loads the same weights from another checkpoint, for a target whose
  own class transformers cannot load (Kimi-K2.5's multimodal wrapper: its language model saved
  as a plain DeepseekV3ForCausalLM);
- `http`: a SGLang >= 0.5.23 server at `extract.canary.url` launched with
  --enable-return-aux-hidden-states (the flags are printed), aux layers only. Where the server
  and the engine cannot hold the target at the same time (one node), fetch the server's states
  first with `--save-reference FILE` (no engine is built), stop the server, then compare with
  `--load-reference FILE`.
Prints each layer's relative error beside the reference's own noise floor (the reference taken
again batched otherwise, in float32 for hf, and rounded to the stored dtype: stages/capture/
canary.py) and exits 1 when one is over its threshold (4x its floor and at least 1e-4, or
`extract.canary.max_rel_error` when set) or matches another layer better than its own.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import torch
import typer

from ..artifacts import merged as merged_files
from ..capture.comparison import (
    CanaryReport,
    compare,
    floors,
    hf_reference,
    neighbourhood,
)
from ..capture.interface import Capture, config_facts
from ..capture.served import SERVES_AUX_SINCE, served_aux, served_flags, serves_aux
from ..cli import StageError, params_key, run
from ..drafter.layers import serving_layer_ids
from ..params.extract import ExtractCanaryParams, ExtractParams
from ..params.schema import PARAMS_FILE
from ..params.target import TargetParams
from ..runtime import parallel
from ..runtime.device import resolve_device
from ..runtime.files import atomic_path
from ..target_model.model import load_causal_lm
from ..wiring.capture import aux_indices, build_capture
from ..wiring.target import api_key


def first_samples(merged_dir: Path, splits: list[str], k: int) -> list[list[int]]:
    """The input_ids of the first `k` merged samples, splits in order."""
    rows = (
        r["input_ids"]
        for split in splits
        if merged_files.split_path(merged_dir, split).exists()
        for r in merged_files.iter_rows(merged_files.split_path(merged_dir, split), ["input_ids"])
    )
    return [list(ids) for ids in itertools.islice(rows, k)]


def collect(capture: Capture, samples: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux, last) of the samples' tokens one after another, float32 on the CPU."""
    got: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for pos, aux, last in capture.capture(samples):
        got[pos] = (aux.float().cpu(), last.float().cpu())
    return (
        torch.cat([got[i][0] for i in range(len(samples))]),
        torch.cat([got[i][1] for i in range(len(samples))]),
    )


def served_reference(
    c: ExtractCanaryParams,
    samples: list[list[int]],
    architecture: str,
    indices: list[int],
    num_layers: int,
    hidden: int,
    sglang_version: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's aux states of the samples' tokens, [T, len(indices) * H], twice: one request
    at a time, then all at once (batched by the server: the floor's second run); after printing
    the flags its launch needs for these indices."""
    if not c.url:
        raise StageError("extract.canary.url: the http reference needs the server's URL")
    if sglang_version and not serves_aux(sglang_version):
        raise StageError(
            f"extract.canary.reference http: SGLang {sglang_version} cannot return aux hidden "
            f"states over HTTP (--enable-return-aux-hidden-states arrived in "
            f"{SERVES_AUX_SINCE}); use reference hf, or serve the target with SGLang "
            f"{SERVES_AUX_SINCE} for the canary"
        )
    key, url = api_key(c.api_key_env, "extract.canary.api_key_env"), c.url
    with params_key("extract.canary"):
        ids = serving_layer_ids(architecture, indices, num_layers, sglang_version)["sglang"]
        print(f"[canary] the server at {c.url} must run with: {served_flags(ids)}")

        def fetch(sample: list[int]) -> torch.Tensor:
            return served_aux(url, sample, len(indices) * hidden, c.timeout_s, key)

        alone = torch.cat([fetch(s) for s in samples])
        with ThreadPoolExecutor(max_workers=len(samples)) as pool:
            together = torch.cat(list(pool.map(fetch, samples)))
    return alone, together


def by_index(states: torch.Tensor, indices: list[int], hidden: int) -> dict[int, torch.Tensor]:
    return {i: states[:, j * hidden : (j + 1) * hidden] for j, i in enumerate(indices)}


def run_canary(
    capture: Capture,
    samples: list[list[int]],
    ext: ExtractParams,
    target: TargetParams,
    sglang_version: str | None = None,
    served: tuple[torch.Tensor, torch.Tensor] | None = None,
    reference_path: str | None = None,
) -> CanaryReport | None:
    """Capture `samples` and compare them with the reference (`served`: the server's aux states
    one request at a time and all at once, fetched before; `reference_path`: the hf reference's
    checkpoint, when not the target's); None on a process that does not write (its forwards
    are part of the tensor-parallel group's)."""
    aux, last = collect(capture, samples)
    if not capture.role.writes:
        return None
    c, indices, hidden = ext.canary, capture.aux_indices, capture.hidden_size
    if c.reference == "hf":
        with params_key("target"):
            path = reference_path or target.path
            model = load_causal_lm(path, c.hf_device, target.dtype, target.trust_remote_code)
        wanted = neighbourhood(indices, capture.num_layers)
        reference, ref_last = hf_reference(model, samples, wanted)
        rebatched, re_last = hf_reference(model, samples, wanted, batched=True)
        exact, ex_last = hf_reference(model.float(), samples, wanted)  # the same weights
        ref: dict = {**reference, "last": ref_last}
        others: list[dict] = [{**rebatched, "last": re_last}, {**exact, "last": ex_last}]
        floor = floors(ref, others, capture.dtype)
        return compare(aux, last, reference, ref_last, indices, floor, c.max_rel_error)
    if served is None:
        served = served_reference(
            c,
            samples,
            capture.architecture,
            indices,
            capture.num_layers,
            hidden,
            sglang_version,
        )
    alone, together = (by_index(states, indices, hidden) for states in served)
    floor = floors(alone, [together], capture.dtype)
    return compare(aux, None, alone, None, indices, floor, c.max_rel_error)


def save_served(
    path: Path,
    ext: ExtractParams,
    target: TargetParams,
    samples: list[list[int]],
    sglang_version: str | None,
) -> None:
    """Fetch the server's aux states of `samples` and keep them in `path` (no engine built)."""
    with params_key("target"):
        arch, num_layers, hidden = config_facts(target.path)
    indices = aux_indices(ext, num_layers)
    alone, together = served_reference(
        ext.canary, samples, arch, indices, num_layers, hidden, sglang_version
    )
    with atomic_path(path) as tmp:
        saved = {"input_ids": samples, "aux_hf_indices": indices, "aux": alone}
        torch.save({**saved, "aux_all_at_once": together}, tmp)
    print(f"[canary] the server's aux states of {len(samples)} samples saved to {path}")


def load_served(
    path: Path, samples: list[list[int]], indices: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    saved = torch.load(path, weights_only=True)
    if saved["input_ids"] != samples or saved["aux_hf_indices"] != indices:
        raise StageError(
            f"{path} holds other samples or layers ({saved['aux_hf_indices']}) than this "
            f"canary's ({indices}); save it again with the same --samples and params"
        )
    if "aux_all_at_once" not in saved:
        raise StageError(
            f"{path} has no second fetch of the samples for the noise floor (saved by an "
            f"earlier version); save it again with --save-reference"
        )
    return saved["aux"], saved["aux_all_at_once"]


def refuse_other_references(
    c: ExtractCanaryParams, served_file: Path | None, reference_path: Path | None
) -> None:
    """Each option belongs to one reference: a file of served states to http, a checkpoint to
    hf."""
    if served_file and c.reference != "http":
        raise StageError(
            "--save-reference / --load-reference: extract.canary.reference is not http"
        )
    if reference_path and c.reference != "hf":
        raise StageError("--reference-path: extract.canary.reference is not hf")


def main(
    merged: Annotated[Path, typer.Option(help="the merge stage's output (data/merged)")],
    samples: Annotated[int, typer.Option(help="merged samples compared, from the first split")] = 8,
    sglang_version: Annotated[
        str | None,
        typer.Option(
            help="the http reference server's SGLang release, where its layer ids depend on it"
        ),
    ] = None,
    save_reference: Annotated[
        Path | None,
        typer.Option(help="only fetch the server's states of the samples into this file"),
    ] = None,
    load_reference: Annotated[
        Path | None, typer.Option(help="compare with the states saved by --save-reference")
    ] = None,
    reference_path: Annotated[
        Path | None,
        typer.Option(
            help="hf reference: the same weights in a checkpoint transformers loads, where the "
            "target's own class is not one (Kimi-K2.5's wrapper)"
        ),
    ] = None,
    params: Annotated[Path, typer.Option(help="the params file")] = PARAMS_FILE,
) -> None:
    """Compare the engine's features of `samples` merged samples with the reference; exit 1 if
    a layer is off. http reference: `--save-reference FILE` only fetches the server's states,
    `--load-reference FILE` compares with them; `--sglang-version` is the server's, when its
    layer ids depend on it (default: the sglang engine's, else ids every version reads alike)."""
    ext = ExtractParams.read(params)
    target = TargetParams.read(params)
    refuse_other_references(ext.canary, save_reference or load_reference, reference_path)
    with params_key("extract.splits"):
        picked = first_samples(merged, ext.splits, samples)
    if not picked:
        raise StageError(f"{merged}: no samples in splits {ext.splits}; run the merge stage")
    if save_reference:
        return save_served(save_reference, ext, target, picked, sglang_version)
    rank, device = parallel.start(resolve_device(target.device))
    target = TargetParams(**{**target.__dict__, "device": str(device)})
    capture = build_capture(ext, target, rank.rank, rank.world)
    served = load_served(load_reference, picked, capture.aux_indices) if load_reference else None
    version = sglang_version or getattr(capture, "version", None)
    reference = str(reference_path) if reference_path else None
    report = run_canary(capture, picked, ext, target, version, served, reference)
    if report is not None:
        print(
            f"[canary] engine {ext.engine} ({capture.architecture}, layers "
            f"{capture.aux_indices}) against {ext.canary.reference}, {len(picked)} samples:"
        )
        for line in report.lines():
            print(f"[canary] {line}")
    if rank.world > 1:
        torch.distributed.barrier()
    parallel.stop()
    if report is not None and not report.passed:
        raise StageError(
            "canary failed: the captured features are not the target's recorded layers "
            "(see the table above); do not extract with these settings"
        )


if __name__ == "__main__":
    run(main)
