"""vocab: the draft vocabulary from the supervised tokens of the train split.

Reads params `vocab` and the target's vocabulary size. Writes data/vocab/d2t_t2d.safetensors
(d2t int64 [draft], t2d bool [target vocab], counts) and reports/vocab.json (coverage: the share of
supervised tokens the draft vocabulary can produce).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import torch
from transformers import AutoConfig

from .artifacts.merged import split_path
from .cli import PathOpt, StageError, run, summary
from .drafter.vocab import build_draft_vocab, coverage, token_counts
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .params.vocab import VocabParams
from .queries import rows
from .reports.vocab import VocabReport
from .runtime.files import atomic_path
from .runtime.outputs import remove_stale_temps_around
from .runtime.tensor_file import save_safetensors


def supervised_counts(train_file: Path, vocab_size: int) -> torch.Tensor:
    """Each target id's count among the split's supervised tokens (the loss reads them)."""
    found = rows(duckdb.connect(), "supervised_token_counts", train_file=str(train_file))
    try:
        return token_counts(((r["token"], r["n"]) for r in found), vocab_size)
    except ValueError as err:
        raise StageError(f"{train_file}: {err}") from None


def main(merged: PathOpt, out: PathOpt, report: PathOpt, params: Path = PARAMS_FILE) -> None:
    """Build the draft vocabulary from the merged train split."""
    train_file = split_path(merged, "train")
    vocab = VocabParams.read(params)
    target = TargetParams.read(params)
    remove_stale_temps_around(out, report)
    vocab_size = (
        AutoConfig.from_pretrained(
            target.path, local_files_only=True, trust_remote_code=target.trust_remote_code
        )
        .get_text_config()  # a multimodal wrapper's (Kimi-K2.5's) language model; else itself
        .vocab_size
    )
    if vocab.draft_vocab_size > vocab_size:
        raise StageError(
            f"vocab.draft_vocab_size: {vocab.draft_vocab_size} is larger than the "
            f"target vocabulary ({vocab_size}); set it to at most {vocab_size}"
        )
    counts = supervised_counts(train_file, vocab_size)
    d2t, t2d, used = build_draft_vocab(counts, vocab.draft_vocab_size)
    with (
        atomic_path(out, (d2t.numel() + counts.numel()) * 8 + t2d.numel()) as tmp,
        open(tmp, "wb") as f,
    ):
        save_safetensors({"d2t": d2t, "t2d": t2d, "counts": counts}, f)
    vocab_report = VocabReport(
        draft_vocab_size=vocab.draft_vocab_size,
        target_vocab_size=vocab_size,
        distinct_supervised_tokens=int((counts > 0).sum()),
        supervised_tokens=int(counts.sum()),
        coverage=round(coverage(counts, t2d), 6),
    )
    vocab_report.write(report)
    print(summary("vocab", vocab_report.to_json()))


if __name__ == "__main__":
    run(main)
