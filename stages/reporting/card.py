"""The drafter's model card: a Hugging Face README.md (YAML front matter, then Markdown) with the
data it learned from, the layer ids each engine reads, its measured acceptance beside the DFlash
drafter's trained on the same data (or why none was trained), and the commands that serve each."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from ..reports.benchmark import BenchmarkReport, NotTrained
from ..reports.merge import MergeCounts


@dataclass(frozen=True)
class FamilyTau:
    """One drafter family's benchmark as the card and the report page set it beside the other's:
    tau at the width the target verifies, and the SGLang launch that serves it."""

    drafter: str  # EAGLE-3 | DFlash
    tokens_per_step: int  # tokens the target verifies per step
    tau: Mapping[float, Mapping[str, float | None]]  # temperature -> dataset -> tau (with "all")
    sglang_command: str

    @classmethod
    def of(cls, report: BenchmarkReport, sglang_command: str) -> FamilyTau:
        return cls(
            report.drafter,
            report.tokens_verified_per_step,
            {
                t: {**{d: v.tau for d, v in r.datasets.items()}, "all": r.tau}
                for t, r in report.temperatures.items()
            },
            sglang_command,
        )

    @property
    def label(self) -> str:
        """The family and its width, as a column heads it."""
        return f"{self.drafter} ({self.tokens_per_step}/step)"


@dataclass(frozen=True)
class CardFacts:
    title: str
    target: str  # the target's Hugging Face id, else its local path
    base_model: str | None  # written to the front matter only when it is a hub id
    license: str
    tags: Sequence[str]
    drafter_dir: str  # where the served commands find the drafter
    num_steps: int  # chain depth the drafter was benchmarked at
    data_mix: Mapping[str, MergeCounts | None]  # per dataset, its train split (None: empty)
    layer_ids: Mapping[str, list | None]  # hf (trained indices), sglang, vllm
    sglang_version: str | None  # the version the ids were written for (None: every one)
    eagle3: FamilyTau  # this drafter's benchmark and launch line
    dflash: FamilyTau | NotTrained  # the DFlash drafter's, trained on the same data, or why not
    training: Mapping[str, object] = field(default_factory=dict)  # steps, replayed tau, ...


def vllm_command(target: str, drafter_dir: str, num_steps: int) -> str:
    spec = {"method": "eagle3", "model": drafter_dir, "num_speculative_tokens": num_steps}
    return shlex.join(["vllm", "serve", target, "--speculative-config", json.dumps(spec)])


def speculators_dir(drafter_dir: str) -> str:
    """Where `speculators_command` writes the converted drafter: beside the export."""
    return drafter_dir.rstrip("/") + "-speculators"


def speculators_command(target: str, drafter_dir: str, vllm_layer_ids: Sequence[int] | None) -> str:
    """`speculators convert` (speculators 0.9.0): the export in the speculators format, for vLLM.

    The converter never reads the layer ids from the export's config.json: it writes
    `eagle_aux_hidden_state_layer_ids: null` (vLLM then captures its default [2, N//2, N-3])
    unless they come in `--algorithm-kwargs`, a JSON object (`json.loads`, in
    speculators/cli/convert.py `convert`) whose keys become keyword arguments of
    `Eagle3Converter.convert`. So the ids vLLM reads from the export's top level are passed there.
    """
    cmd = ["speculators", "convert", drafter_dir, "--algorithm", "eagle3", "--verifier", target]
    cmd += ["--output-path", speculators_dir(drafter_dir)]
    if vllm_layer_ids is not None:
        kwargs = {"eagle_aux_hidden_state_layer_ids": list(vllm_layer_ids)}
        cmd += ["--algorithm-kwargs", json.dumps(kwargs)]
    return shlex.join(cmd)


@dataclass(frozen=True)
class ServingCommand:
    """One way to serve the drafter, as the model card and the report page both print it."""

    engine: str  # what it serves with, and from which files
    note: str  # what to know before running it (Markdown: `code`), or ""
    lines: Sequence[str]  # the shell commands, in order


def serving_commands(
    target: str,
    drafter_dir: str,
    num_steps: int,
    sglang_command: str,
    vllm_layer_ids: Sequence[int] | None,
    dflash_command: str | None,
) -> list[ServingCommand]:
    """SGLang, vLLM from the export as it is, vLLM in the speculators format, and SGLang with the
    DFlash drafter instead (`dflash_command` None: no DFlash drafter was trained to serve)."""
    eagle3 = [
        ServingCommand("SGLang", "", [sglang_command]),
        ServingCommand(
            "vLLM, from the export as it is",
            "vLLM reads the top-level `eagle_aux_hidden_state_layer_ids`",
            [vllm_command(target, drafter_dir, num_steps)],
        ),
        ServingCommand(
            "vLLM, in the speculators format",
            "`speculators convert` (checked against speculators 0.9.0) does not carry the layer"
            " ids over from config.json (it writes null, and vLLM then falls back to"
            " [2, N//2, N-3]), so they are passed in `--algorithm-kwargs`",
            [
                speculators_command(target, drafter_dir, vllm_layer_ids),
                vllm_command(target, speculators_dir(drafter_dir), num_steps),
            ],
        ),
    ]
    if dflash_command is None:
        return eagle3
    dflash = ServingCommand(
        "SGLang, the DFlash drafter instead",
        "DFLASH reads `--speculative-num-draft-tokens` as its block size; its draft runs on"
        " flashinfer, fa3, fa4 or triton attention, and falls back to flashinfer, with a"
        " warning, from any other backend",
        [dflash_command],
    )
    return [*eagle3, dflash]


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}"
        if isinstance(v, int):
            return f"{v:,}"
        return "-" if v is None else str(v)

    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows),
    ]


def model_card(f: CardFacts) -> str:
    sections = [
        _card_header(f),
        _data_mix_section(f),
        _layers_section(f),
        _acceptance_section(f),
        _training_section(f),
        _serving_section(f),
    ]
    return "\n".join(line for s in sections if s for line in (*s, ""))


def _card_header(f: CardFacts) -> list[str]:
    """The YAML front matter the hub reads (base_model only when set), the title, what it is."""
    front: dict = {}
    if f.base_model:
        front["base_model"] = f.base_model
    front.update(license=f.license, tags=list(f.tags), pipeline_tag="text-generation")
    return [
        "---",
        yaml.safe_dump(front, sort_keys=False).rstrip(),
        "---",
        "",
        f"# {f.title}",
        "",
        f"An EAGLE-3 draft model for `{f.target}`, trained on the target's own replies (reasoning,"
        " answers and tool calls as the target generated them, token for token). It proposes"
        f" chains of {f.num_steps} tokens that the target verifies; it never changes what the"
        " target outputs. Format: SGLang's `LlamaForCausalLMEagle3` (`config.json` +"
        " `model.safetensors`), which vLLM loads too.",
    ]


def _data_mix_section(f: CardFacts) -> list[str]:
    """Samples and tokens per dataset, with each one's share of the supervised tokens."""
    total = MergeCounts.total(c for c in f.data_mix.values() if c)
    table = _table(
        ["dataset", "samples", "tokens", "supervised tokens", "share of supervised"],
        [
            [
                name,
                c and c.samples,
                c and c.tokens,
                c and c.supervised_tokens,
                f"{(c.supervised_tokens if c else 0) / max(total.supervised_tokens, 1):.1%}",
            ]
            for name, c in f.data_mix.items()
        ]
        + [["all", total.samples, total.tokens, total.supervised_tokens, "100%"]],
    )
    return [
        "## Data mix",
        "",
        *table,
        "",
        "Tokens are whole sequences (prompt + reply); supervised tokens are the target's replies,"
        " the only positions trained on.",
    ]


def _layers_section(f: CardFacts) -> list[str]:
    """The layer ids each engine reads, each in its own convention, beside the trained ones."""
    version = f"SGLang {f.sglang_version}" if f.sglang_version else "every SGLang version"
    table = _table(
        ["engine", "config.json key", "layer ids"],
        [
            ["trained on (HF hidden_states indices)", "-", f.layer_ids.get("hf")],
            [
                f"SGLang ({version})",
                "eagle_config.eagle_aux_hidden_state_layer_ids",
                f.layer_ids.get("sglang"),
            ],
            ["vLLM", "eagle_aux_hidden_state_layer_ids", f.layer_ids.get("vllm")],
        ],
    )
    return ["## Layers the draft reads", "", *table]


def _acceptance_section(f: CardFacts) -> list[str]:
    """tau per dataset (and all of them) of each trained family, side by side at each
    temperature; a family not trained is said so beneath, with why."""
    families = [fam for fam in (f.eagle3, f.dflash) if isinstance(fam, FamilyTau)]
    temps = list(dict.fromkeys(t for fam in families for t in fam.tau))
    datasets = sorted({d for fam in families for t in fam.tau for d in fam.tau[t]} - {"all"})
    columns = [(t, fam) for t in temps for fam in families]
    table = _table(
        ["dataset", *(f"{fam.label}, T = {t}" for t, fam in columns)],
        [[d, *(fam.tau.get(t, {}).get(d) for t, fam in columns)] for d in [*datasets, "all"]],
    )
    return [
        "## Acceptance length (tau)",
        "",
        *table,
        *(["", f"{f.dflash.line}."] if isinstance(f.dflash, NotTrained) else []),
        "",
        "tau: tokens the target emits per verify step with the drafter (plain decoding: 1.0), on"
        " the same held-out prompts of each dataset; n/step: the tokens the target verifies per"
        f" step (EAGLE-3: a chain of {f.num_steps} drafts, top-k 1, plus the target's own; DFlash:"
        " its block). Compare the two at equal width.",
    ]


def _training_section(f: CardFacts) -> list[str]:
    """The training figures as a list; no section when there are none."""
    if not f.training:
        return []
    return ["## Training", "", *(f"- {k}: {v}" for k, v in f.training.items())]


def _serving_section(f: CardFacts) -> list[str]:
    """The commands that serve the drafter: SGLang, vLLM as exported, vLLM via speculators;
    then SGLang with the DFlash drafter, when one was trained."""
    commands = serving_commands(
        f.target,
        f.drafter_dir,
        f.num_steps,
        f.eagle3.sglang_command,
        f.layer_ids.get("vllm"),
        None if isinstance(f.dflash, NotTrained) else f.dflash.sglang_command,
    )
    lines = ["## Serving", ""]
    for c in commands:
        lines += [f"{c.engine} ({c.note}):" if c.note else f"{c.engine}:", ""]
        lines += ["```bash", *c.lines, "```", ""]
    return [*lines, f"`{f.drafter_dir}` is this directory (or its Hugging Face id once uploaded)."]
