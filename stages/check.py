"""check: every key of params.yaml against the typed params, before any other stage runs.

A stage reads only the sections it needs, so a key no stage reads (a typo such as
`train.learning_rate` for `train.lr`) would rerun nothing and be ignored. This stage depends on the
whole params.yaml file, so any edit reruns it; every other stage depends on its output, so DVC runs
it first and stops at its error, one line naming the key and what is allowed, before it has removed
or rewritten any other stage's outputs. A check that passes writes the same file again, so it reruns
nothing downstream.

Beyond the keys' types it checks what a later stage would otherwise find out with a path in its
error instead of the key: every file params.yaml names exists, every dataset format has an
adapter, the sglang capture engine's target has no Mamba or linear-attention layers,
`train.sglang_version` and `dflash.sglang_version` are release numbers, and `dflash.mask_token_id`
is a token of the target's vocabulary that is no role or stop token (generation emits those).
"""

from __future__ import annotations

import json
from pathlib import Path

from .cli import PathOpt, run
from .drafter.layers import parse_version
from .params.benchmark import BenchmarkParams, BenchmarkSource
from .params.datasets import PrepParams, read_datasets
from .params.dflash import DFlashParams
from .params.extract import ExtractParams
from .params.schema import PARAMS_FILE
from .params.sections import check_all
from .params.target import TargetParams
from .params.train import TrainParams
from .reports.check import CheckReport
from .runtime.errors import ParamsError
from .sources import FORMATS
from .target_model.architecture import recurrent_model_type
from .wiring.target import target_roles, target_tokenizer


def main(out: PathOpt, params: Path = PARAMS_FILE) -> None:
    """Check every key of params.yaml (unknown keys, types, ranges) before any stage runs."""
    check_all(params)  # ParamsError on the first bad key
    check_inputs(params)
    CheckReport().write(out)  # the same bytes whenever the check passes
    print(f"[check] {params}: every key known, of its type and in its range")


def check_inputs(params: Path) -> None:
    """The files and names params.yaml points at, each error naming its dotted key."""
    target = TargetParams.read(params)
    exists(params, "target.path", target.path, "the target's local Hugging Face directory")
    if target.chat_template:
        exists(params, "target.chat_template", target.chat_template, "a Jinja template file")
    check_capture_target(params, target.path)
    sources: dict[str, PrepParams | BenchmarkSource] = {
        f"datasets.{n}.prep": d.prep for n, d in read_datasets(params).items()
    }
    for n, extra in BenchmarkParams.read(params).datasets.items():
        sources[f"benchmark.datasets.{n}"] = extra
    for key, source in sources.items():
        if source.format not in FORMATS:
            raise ParamsError(
                f"{params}:{key}.format: {source.format!r} is no known format; known: "
                f"{', '.join(FORMATS)} (an adapter in stages/sources/ adds one)"
            )
        exists(params, f"{key}.path", source.path, "the dataset's file or folder")
    for key, version in (
        ("train", TrainParams.read(params).sglang_version),
        ("dflash", DFlashParams.read(params).sglang_version),
    ):
        if version is not None:
            try:
                parse_version(version)
            except ValueError as err:
                raise ParamsError(f"{params}:{key}.sglang_version: {err} (or null)") from None
    check_mask_token(params, target)


def check_mask_token(params: Path, target: TargetParams) -> None:
    """DFlash fills a block's drafted positions with `dflash.mask_token_id`: it must be a token
    of the target's vocabulary (SGLang cannot grow the embedding) that generation never emits,
    so none of the tokenizer's roles, stop or special ids the template and the engine use."""
    mask = DFlashParams.read(params).mask_token_id
    key = f"{params}:dflash.mask_token_id"
    if mask is None:
        raise ParamsError(
            f"{key}: null; name a token id of the target's vocabulary that generation never "
            f"emits (a reserved or padding token)"
        )
    config_file = Path(target.path) / "config.json"
    if not config_file.is_file():
        return  # no target there: target.path's own check says so
    config = json.loads(config_file.read_text())
    vocab = (config.get("text_config") or config).get("vocab_size")
    if isinstance(vocab, int) and not 0 <= mask < vocab:
        raise ParamsError(f"{key}: {mask} is outside the target's vocabulary (0..{vocab - 1})")
    tokenizer = target_tokenizer(target)
    roles = {k: v for k, v in target_roles(target, tokenizer).as_dict().items() if v is not None}
    named = [role for role, tid in roles.items() if tid == mask]
    if named:
        raise ParamsError(
            f"{key}: {mask} is the target's {named[0]} token, which generation emits; name a "
            f"reserved or padding token instead"
        )


def check_capture_target(params: Path, path: str) -> None:
    """The sglang capture engine runs SGLang's model runner without the scheduler that sets up a
    Mamba or linear-attention target's state pool: such a target is refused here."""
    config_file = Path(path) / "config.json"
    if ExtractParams.read(params).engine != "sglang" or not config_file.exists():
        return
    config = json.loads(config_file.read_text())
    model_type = recurrent_model_type(config)
    if model_type is not None:
        architecture = (config.get("architectures") or ["?"])[0]
        raise ParamsError(
            f"{params}:extract.engine: sglang cannot capture {path} ({architecture}, model "
            f"type {model_type}): its Mamba / linear-attention layers need the state pool "
            f"SGLang's scheduler sets up, which the capture engine does not build; use "
            f"extract.engine hf"
        )


def exists(params: Path, key: str, value: str, what: str) -> None:
    if not Path(value).exists():
        raise ParamsError(
            f"{params}:{key}: {value} does not exist ({what}, relative to the project root)"
        )


if __name__ == "__main__":
    run(main)
