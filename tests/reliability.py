"""Helpers of the reliability tests (bad input, corrupt input, full disks, locks, kills): params for
the committed demo target, merged samples, an exported drafter, and the tree a run leaves."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml
from transformers import AutoConfig

from stages import extract, generate
from stages.artifacts.raw import read_raw
from stages.drafter.export import export_drafter
from stages.drafter.model import Eagle3Config, Eagle3Drafter
from stages.drafter.vocab import build_draft_vocab
from stages.params.datasets import read_dataset
from stages.params.extract import ExtractParams
from stages.params.generate import GenerateParams
from stages.params.target import TargetParams
from stages.prep import prepare
from tests.conftest import DEMO_TARGET
from tests.runtime.test_distributed import write_merged

DEMO_VOCAB = 2048


def demo_params(tmp: Path, **sections) -> Path:
    """params.yaml for the demo target on CPU, one small dataset `d`, with `sections` merged in
    (a section given as None is left out)."""
    params: dict = {
        "target": {"path": str(DEMO_TARGET), "device": "cpu", "dtype": "float32", "cpu_threads": 1},
        "datasets": {"d": {"prep": {"format": "sharegpt", "path": str(tmp / "source.json")}}},
        "generate": {"engine": "hf", "batch_size": 4, "max_new_tokens": 8, "append_every": 2},
        "extract": {"layers": [2, 4, 5], "shard_tokens": 120, "batch_tokens": 256},
        "train": {
            "ttt_steps": 2,
            "max_steps": 4,
            "batch_size": 2,
            "eval_every": 2,
            "eval_max_samples": 4,
            "checkpoint_every": 2,
            "device": "cpu",
            "cpu_threads": 1,
        },
        "vocab": {"draft_vocab_size": 256},
    }
    for name, value in sections.items():
        if value is None:
            params.pop(name, None)
        elif isinstance(value, dict) and isinstance(params.get(name), dict):
            params[name] = {**params[name], **value}
        else:
            params[name] = value
    path = tmp / "params.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def write_vocab(path: Path, draft: int = 256) -> Path:
    from safetensors.torch import save_file

    d2t, t2d, _ = build_draft_vocab(torch.arange(DEMO_VOCAB, 0, -1, dtype=torch.int64), draft)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"d2t": d2t, "t2d": t2d}, str(path))
    return path


def export_demo_drafter(out: Path, aux: tuple[int, ...] = (2, 4, 5), draft: int = 64) -> Path:
    """A drafter for the demo target, exported (and checked) as the train stage does."""
    target_config = AutoConfig.from_pretrained(DEMO_TARGET, local_files_only=True)
    cfg = Eagle3Config.from_target(target_config, draft, list(aux))
    torch.manual_seed(0)
    drafter = Eagle3Drafter(cfg)
    used = torch.arange(draft)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    drafter.set_vocab(used - torch.arange(draft), t2d)
    return export_drafter(drafter, cfg, out, target_config, {"purpose": "test"})


def tree(root: Path) -> list[str]:
    """Every path under `root`, relative, sorted (folders end with /)."""
    return sorted(
        str(p.relative_to(root)) + ("/" if p.is_dir() else "") for p in Path(root).rglob("*")
    )


def leftovers(root: Path) -> list[str]:
    """What no finished stage leaves: temp files and output locks."""
    return [p for p in tree(root) if ".tmp-" in p or p.endswith(".stage.lock")]


def source(tmp: Path, ids: list, name: str = "source.json") -> Path:
    """A ShareGPT file of one short question per id."""
    rows = [
        {
            "id": sid,
            "conversations": [
                {"from": "human", "value": f"Tell me about topic number {i}."},
                {"from": "gpt", "value": "Sure."},
            ],
        }
        for i, sid in enumerate(ids)
    ]
    path = tmp / name
    path.write_text(json.dumps(rows))
    return path


def generated_run(tmp: Path) -> Path:
    """Prompts and the raw data of one uninterrupted generation (demo target, 6 samples, four
    parts compacted into part-00003) in `tmp`, with its params.yaml."""
    source(tmp, [f"s{i}" for i in range(6)])
    params = demo_params(tmp)
    ds = read_dataset("d", params)
    target = TargetParams.read(params)
    prompts = tmp / "data/prompts/d.parquet"
    prepare("d", ds.prep, ds.expect, target, prompts, tmp / "reports/prep/d.json")
    gen = GenerateParams.read(params)
    generate.generate_dataset("d", prompts, tmp / "data/raw/d", gen, 10**6, target)
    return tmp


def extracted_run(tmp: Path) -> Path:
    """Merged samples, a vocabulary and one uninterrupted extraction (demo target, 11 samples,
    several shards) in `tmp`, with its params.yaml."""
    write_merged(tmp / "merged", n_train=8, n_eval=3)
    write_vocab(tmp / "vocab.safetensors")
    params = demo_params(tmp)
    ext = ExtractParams.read(params)
    target = TargetParams.read(params)
    extract.extract(tmp / "merged", tmp / "hidden", ext, target)
    return tmp


_RUNS: dict[str, Path] = {}


def shared_run(tmp_path_factory, name: str, make) -> Path:
    """`make(folder)` once per test session (the modules' fixtures share it); tests copy what they
    change."""
    if name not in _RUNS:
        _RUNS[name] = make(tmp_path_factory.mktemp(name))
    return _RUNS[name]


def outputs(raw_dir: Path) -> dict:
    return {r["sample_id"]: r["output_ids"] for r in read_raw(raw_dir).to_pylist()}


# The stages' command lines over a tmp tree laid out as the project's.


def generate_args(tmp: Path, params: Path) -> list:
    return ["d", "--params", params, "--prompts", tmp / "data/prompts/d.parquet",
            "--out", tmp / "data/raw/d", "--report", tmp / "reports/generate/d.json"]  # fmt: skip


def merge_args(tmp: Path, params: Path) -> list:
    return ["--params", params, "--raw", tmp / "data/raw", "--out", tmp / "data/merged",
            "--report", tmp / "reports/merge.json"]  # fmt: skip


def quality_args(tmp: Path, params: Path) -> list:
    return ["--params", params, "--raw-dir", tmp / "data/raw", "--prep-dir", tmp / "reports/prep",
            "--report", tmp / "reports/quality.json", "--summary", tmp / "reports/quality.md",
            "--plot", tmp / "reports/plots/lengths.csv"]  # fmt: skip


def extract_args(tmp: Path, out: str) -> list:
    return ["--params", tmp / "params.yaml", "--merged", tmp / "merged", "--out", tmp / out,
            "--report", tmp / f"reports/{out}.json"]  # fmt: skip


def train_args(tmp: Path, hidden: str) -> list:
    return ["--params", tmp / "params.yaml", "--hidden-dir", tmp / hidden,
            "--vocab-file", tmp / "vocab.safetensors", "--checkpoint-dir", tmp / "checkpoints",
            "--out-dir", tmp / "models/drafter", "--report", tmp / "reports/train.json",
            "--plots", tmp / "reports/plots"]  # fmt: skip
