"""report: what people read about a run, after the benchmark. Three outputs:

- reports/index.html: one self-contained page (inline SVG, no script, no network): per dataset
  the length histograms (prompt, reasoning, answer), finish reasons and truncation, reasoning
  presence, tool-call integrity, budget used, failures with their messages, a few sample records
  decoded with the target's tokenizer (reasoning, answer, tool calls apart, special tokens
  shown); training curves; the EAGLE-3 and DFlash benchmarks' tau side by side per dataset and
  position against plain decoding (or, where no DFlash drafter was trained, why not).
- reports/metrics.json: THE DVC metrics file, the dozen figures a run is judged by, each key
  named with its unit (`stages/reporting/summary.py`); beside it reports/metrics_notes.json, why
  each null figure is null (text, which a metrics file cannot hold without DVC printing it).
- the drafter's model card (a Hugging Face README.md), beside the report: its tau is only known
  after the benchmark, which reads the drafter, so train cannot write it, and no stage writes
  into another stage's output. It gives the DFlash drafter's tau and SGLang launch line too, or
  says it was not trained, and why.

Reads params `report`, `datasets`, `quality.histogram_buckets`, `target` (the tokenizer) and
`train.sglang_version`. The data questions are the quality stage's (`stages/queries/quality.py`, the
same SQL), plus failures and sample records (stages/queries).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from .cli import PathOpt, run
from .params.datasets import DatasetParams, read_datasets
from .params.quality import QualityParams
from .params.report import CardParams, ReportParams
from .params.schema import PARAMS_FILE
from .params.target import TargetParams
from .params.train import TrainParams
from .queries import open_samples, rows
from .queries.quality import quality_answers
from .reporting.card import CardFacts, FamilyTau, model_card, serving_commands
from .reporting.page import ReportData, SampleView, Serving, render
from .reporting.samples import sample_views
from .reporting.summary import run_metrics
from .reports.benchmark import (
    BenchmarkReport,
    NotTrained,
    read_benchmark,
    read_dflash_benchmark,
)
from .reports.extract import ExtractReport, eagle3_layers
from .reports.generate import GenerateReport
from .reports.merge import MergeReport
from .reports.metrics import MetricsNotes, RunMetrics
from .reports.train import TrainReport
from .reports.vocab import VocabReport
from .runtime.files import write_text
from .runtime.outputs import remove_stale_temps_around
from .serving.launch import Speculation
from .wiring.artifacts import raw_files
from .wiring.target import target_roles, target_tokenizer


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def read_csv(path: Path) -> list[dict]:
    """A plots CSV, numbers as numbers (absent file: no rows)."""
    if not path.exists():
        return []

    def num(v: str):
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                return v or None

    with open(path, newline="") as f:
        return [{k: num(v) for k, v in row.items()} for row in csv.DictReader(f)]


@dataclass(frozen=True)
class RawViews:
    """What the report shows of the raw generations, from one pass over the verified parts: the
    metrics judge the answers, the page shows all of it."""

    datasets: list[str]  # in params order
    answers: dict  # the quality questions' rows
    failures: list[dict]
    samples: list[SampleView]


def raw_views(
    raw_dir: Path,
    datasets: dict[str, DatasetParams],
    p: ReportParams,
    q: QualityParams,
    target: TargetParams,
) -> RawViews:
    """Asked of the verified raw parts themselves, as the quality stage asks them (the same SQL),
    plus the failures and the decoded samples only the page shows."""
    names = list(datasets)
    files = raw_files([raw_dir / n for n in names], "report")
    budgets = {n: d.generate.budget_tokens for n, d in datasets.items()}
    answers = quality_answers(files, budgets, q.histogram_buckets)
    con = open_samples(files)
    failures = rows(con, "failures", limit=p.max_failures)
    records = rows(con, "sample_records", per_dataset=p.samples_per_dataset)
    tokenizer = target_tokenizer(target)
    samples = sample_views(records, tokenizer, target_roles(target, tokenizer), p.prompt_tokens)
    return RawViews(names, answers, failures, samples)


@dataclass(frozen=True)
class StageReports:
    """The earlier stages' reports, read together: the metrics, the card and the page each draw
    on several of them."""

    generate: dict[str, GenerateReport]  # per dataset
    merge: MergeReport
    vocab: VocabReport
    extract: ExtractReport
    train: TrainReport
    benchmark: BenchmarkReport
    dflash: BenchmarkReport | NotTrained  # the DFlash drafter's benchmark, or why none ran

    def metrics(
        self, answers: dict, datasets: dict[str, DatasetParams]
    ) -> tuple[RunMetrics, MetricsNotes]:
        """The figures of reports/metrics.json and their notes, each dataset judged by what it
        is expected to hold (reasoning, tool calls)."""
        return run_metrics(
            generate=self.generate,
            merge=self.merge,
            answers=answers,
            expect={n: (d.expect.reasoning, d.expect.tool_calls) for n, d in datasets.items()},
            vocab=self.vocab,
            extract=self.extract,
            train=self.train,
            benchmark=self.benchmark,
            dflash=self.dflash,
        )


@dataclass(frozen=True)
class ServedDrafter:
    """How the drafters are served, worked out once: the card and the page must print the same
    model, widths and layer ids in their commands."""

    model: str  # what the commands serve: the card's base_model, else the target's path
    drafter_dir: Path
    num_steps: int  # the chain depth the benchmark measured
    layer_ids: dict[str, list | None]  # hf (trained indices), sglang, vllm
    dflash: FamilyTau | NotTrained  # DFlash's tau and launch line at its benchmark's block size

    @property
    def sglang_command(self) -> str:
        """The SGLang launch line both print."""
        return Speculation.eagle3(self.drafter_dir, self.num_steps).launch_line(self.model)

    @property
    def dflash_command(self) -> str | None:
        """The DFlash drafter's SGLang launch line; None: none was trained to serve."""
        return None if isinstance(self.dflash, NotTrained) else self.dflash.sglang_command

    def families(self, reports: StageReports) -> tuple[FamilyTau, FamilyTau | NotTrained]:
        """EAGLE-3's benchmark and DFlash's (or why it has none), each with the launch line that
        serves it."""
        return FamilyTau.of(reports.benchmark, self.sglang_command), self.dflash


def dflash_family(
    report: BenchmarkReport | NotTrained, dflash_dir: Path, model: str
) -> FamilyTau | NotTrained:
    """DFlash's tau, served at the block size its benchmark measured; NotTrained as it is: there
    is no drafter to serve."""
    if isinstance(report, NotTrained):
        return report
    speculation = Speculation.dflash(dflash_dir, report.tokens_verified_per_step)
    return FamilyTau.of(report, speculation.launch_line(model))


def served_drafter(
    card: CardParams, target: TargetParams, drafter_dirs: tuple[Path, Path], reports: StageReports
) -> ServedDrafter:
    """The layer ids as trained beside those the export gives each server, so that a mismatch
    shows; the chain depth and the block size the benchmarks ran. `drafter_dirs`: the EAGLE-3
    and the DFlash exports."""
    drafter_dir, dflash_dir = drafter_dirs
    drafter_config = read_json(drafter_dir / "config.json")
    layer_ids = {
        "hf": eagle3_layers(reports.extract),
        "sglang": (drafter_config.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids"
        ),
        "vllm": drafter_config.get("eagle_aux_hidden_state_layer_ids"),
    }
    model = card.base_model or target.path
    return ServedDrafter(
        model=model,
        drafter_dir=drafter_dir,
        num_steps=reports.benchmark.num_steps,
        layer_ids=layer_ids,
        dflash=dflash_family(reports.dflash, dflash_dir, model),
    )


def card_facts(
    card: CardParams,
    served: ServedDrafter,
    sglang_version: str | None,
    names: list[str],
    reports: StageReports,
) -> CardFacts:
    """What the model card states: the card params, the data mix, the measured tau and the
    training figures, each from the stage that knows it."""
    vocab, train = reports.vocab, reports.train
    eagle3, dflash = served.families(reports)
    return CardFacts(
        title=card.title or f"EAGLE-3 draft model for {served.model}",
        target=served.model,
        base_model=card.base_model,
        license=card.license,
        tags=card.tags,
        drafter_dir=str(served.drafter_dir),
        num_steps=served.num_steps,
        data_mix={n: reports.merge.per_dataset.train.get(n) for n in names},
        layer_ids=served.layer_ids,
        sglang_version=sglang_version,
        eagle3=eagle3,
        dflash=dflash,
        training={
            "steps": train.steps,
            "best step (by replayed tau)": train.best_step,
            "replayed tau on the eval split": train.best_replayed_tau,
            "draft vocabulary": f"{vocab.draft_vocab_size} of {vocab.target_vocab_size} target "
            f"ids, covering {vocab.coverage:.1%} of supervised tokens",
        },
    )


def report_data(
    target_path: str,
    summary: tuple[RunMetrics, MetricsNotes],
    raw: RawViews,
    reports: StageReports,
    served: ServedDrafter,
    plots: Path,
    card: Path,
    max_chars: int,
) -> ReportData:
    """Everything the page shows, the training curves read from the plots CSVs train wrote;
    `summary`: the figures and their notes."""
    figures, notes = summary
    layer_ids, drafter_dir = served.layer_ids, str(served.drafter_dir)
    commands = serving_commands(
        served.model,
        drafter_dir,
        served.num_steps,
        served.sglang_command,
        layer_ids["vllm"],
        served.dflash_command,
    )
    return ReportData(
        title="EAGLE-3 pipeline report",
        target=target_path,
        metrics=figures,
        notes=notes,
        datasets=raw.datasets,
        answers=raw.answers,
        failures=raw.failures,
        samples=raw.samples,
        train=reports.train,
        train_loss=read_csv(plots / "train_loss.csv"),
        train_evals=read_csv(plots / "train_evals.csv"),
        train_acceptance=read_csv(plots / "train_acceptance.csv"),
        benchmark=reports.benchmark,
        dflash=reports.dflash,
        serving=Serving(
            layer_ids={
                "trained on (HF hidden_states indices)": layer_ids["hf"],
                "SGLang (eagle_config.eagle_aux_hidden_state_layer_ids)": layer_ids["sglang"],
                "vLLM (eagle_aux_hidden_state_layer_ids)": layer_ids["vllm"],
            },
            commands=commands,
            card=str(card),
        ),
        max_chars=max_chars,
    )


def main(
    raw_dir: PathOpt,
    generate_dir: PathOpt,
    merge_report: PathOpt,
    vocab_report: PathOpt,
    extract_report: PathOpt,
    train_report: PathOpt,
    benchmark_report: PathOpt,
    dflash_report: PathOpt,
    plots: PathOpt,
    drafter_dir: PathOpt,
    dflash_dir: PathOpt,
    out: PathOpt,
    metrics: PathOpt,
    metrics_notes: PathOpt,
    card: PathOpt,
    params: Path = PARAMS_FILE,
) -> None:
    """Write the HTML report, the compact metrics with their notes, and the model card."""
    p = ReportParams.read(params)
    q = QualityParams.read(params)
    target = TargetParams.read(params)
    train_params = TrainParams.read(params)
    datasets = read_datasets(params)
    remove_stale_temps_around(out, metrics, metrics_notes, card)
    reports = StageReports(  # first: a report its stage must write again stops the stage at once
        generate={n: GenerateReport.read(generate_dir / f"{n}.json") for n in datasets},
        merge=MergeReport.read(merge_report),
        vocab=VocabReport.read(vocab_report),
        extract=ExtractReport.read(extract_report),
        train=TrainReport.read(train_report),
        benchmark=read_benchmark(benchmark_report),
        dflash=read_dflash_benchmark(dflash_report),
    )
    raw = raw_views(raw_dir, datasets, p, q, target)
    figures, notes = reports.metrics(raw.answers, datasets)
    served = served_drafter(p.card, target, (drafter_dir, dflash_dir), reports)
    facts = card_facts(p.card, served, train_params.sglang_version, raw.datasets, reports)
    page = render(
        report_data(target.path, (figures, notes), raw, reports, served, plots, card, p.max_chars)
    )
    figures.write(metrics)
    notes.write(metrics_notes)
    write_text(model_card(facts), card)
    write_text(page, out)
    print(f"[report] {out.resolve()}  metrics: {metrics}  model card: {card}")


if __name__ == "__main__":
    run(main)
