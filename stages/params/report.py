"""The `report` section: the page, the metrics and the model card."""

from __future__ import annotations

from dataclasses import dataclass

from .schema import Ranged, Section, param


@dataclass(frozen=True)
class CardParams(Ranged):
    """The drafter's model card (Hugging Face front matter and title)."""

    KEY = "report.card"

    title: str | None = param(None, "Its title (null: 'EAGLE-3 draft model for <target>').")
    base_model: str | None = param(
        None, "The target's Hugging Face id, e.g. moonshotai/Kimi-K2.5 (null: no base_model key)."
    )
    license: str = param("apache-2.0", "The card's license.")
    tags: list[str] = param(
        help="The card's tags.", factory=lambda: ["eagle3", "speculative-decoding", "draft-model"]
    )


@dataclass(frozen=True)
class ReportParams(Section):
    """reports/index.html, reports/metrics.json and models/card/README.md."""

    KEY = "report"

    samples_per_dataset: int = param(3, "Sample records shown per dataset, decoded.", ge=0)
    prompt_tokens: int = param(256, "The end of each sample's prompt shown, in tokens.", ge=0)
    max_chars: int = param(
        4000, "Per part of a sample (reasoning, answer, tool calls); the rest is cut.", ge=1
    )
    max_failures: int = param(100, "Failed turns listed with their messages.", ge=0)
    card: CardParams = param(help="The drafter's model card.", factory=CardParams)
