"""Entry point shared by the stage modules: a typer command whose expected errors end the process
with one clear line (which file, row or key, and what would fix it) instead of a traceback."""

from __future__ import annotations

import contextlib
import errno
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from .runtime.errors import EngineError, StageError

# A path the stage's command in dvc.yaml passes (`--out data/...`): paths live in dvc.yaml only.
PathOpt = Annotated[Path, typer.Option()]
# What each path option of a stage is, for `python -m stages.<stage> --help`; the names are the
# stages' own (an option without an entry here fails tests/stages/test_cli_help.py).
OPTION_HELP = {
    "dataset": "The dataset's name under `datasets` in params.yaml.",
    "params": "The params file.",
    "out": "What the stage writes (its output in dvc.yaml).",
    "report": "The stage's report to write (JSON).",
    "raw": "The folder of every dataset's raw generations (data/raw).",
    "raw_dir": "The folder of every dataset's raw generations (data/raw).",
    "prompts": "The dataset's prompts (prep's output).",
    "prep_dir": "The folder of the prep reports.",
    "merged": "The merged folder (merge's output).",
    "summary": "The quality gate's summary to write (Markdown).",
    "plot": "The CSV behind the stage's chart, to write.",
    "plots": "The folder of the CSVs behind the charts.",
    "hidden_dir": "The captured hidden states (extract's output).",
    "vocab_file": "The draft vocabulary mapping (vocab's output).",
    "checkpoint_dir": "Where training keeps its checkpoints, to resume from.",
    "out_dir": "The exported drafter to write (SGLang's EAGLE-3 format).",
    "drafter_dir": "The exported drafter (its training stage's output).",
    "dflash_dir": "The exported DFlash drafter (train_dflash's output).",
    "generate_dir": "The folder of the generate reports.",
    "merge_report": "The merge report (JSON).",
    "vocab_report": "The vocabulary report (JSON).",
    "extract_report": "The extract report (JSON).",
    "train_report": "The train report (JSON).",
    "benchmark_report": "The benchmark report (JSON).",
    "dflash_report": "The DFlash benchmark report (JSON).",
    "metrics": "The compact metrics to write (JSON, what `dvc metrics diff` reads).",
    "metrics_notes": "Why each null figure of the metrics is null, to write (JSON).",
    "live": "DVCLive's folder of the run's figures, updated as it trains (omitted: none).",
    "card": "The model card to write (Markdown).",
}


# OS errors a stage reports in one line: a full disk or quota, a folder it may not write, an
# output folder another process holds (stages/runtime WriteFailed, OutputLocked), another
# torchrun rank lost (stages/runtime/parallel.py CollectiveFailed)
ONE_LINE_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EBUSY,
        errno.ECONNABORTED,
    }
)


@contextlib.contextmanager
def params_key(key: str) -> Iterator[None]:
    """Prefix a library error with the params key (section) whose values caused it: the library
    speaks of its own arguments, and the same code serves several stages."""
    try:
        yield
    except (ValueError, KeyError, FileNotFoundError, EngineError) as err:
        raise StageError(f"{key}: {err.args[0] if err.args else err}") from err


def command(main: Callable) -> Any:
    """The stage's `main` as a command, each option with its help from OPTION_HELP."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(main)
    built = typer.main.get_command(app)
    options: list[Any] = [p for p in built.params if p.param_type_name == "option"]
    for option in options:
        if not option.help:
            option.help = OPTION_HELP.get(option.name or "")
    return built


def run(main: Callable) -> None:
    try:
        command(main).main(standalone_mode=False)
    except (StageError, EngineError, ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except OSError as err:
        if err.errno not in ONE_LINE_ERRNOS:
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as err:  # click usage errors and the like
        if type(err).__module__.startswith(("click", "typer")):  # typer vendors click too
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise


def summary(tag: str, values: dict) -> str:
    """A stage's closing figures for people: one `name  value` line each, under `[tag]`, nested
    figures as dotted names, numbers with thousands separators (the JSON report keeps them all
    exactly)."""

    def flat(prefix: str, value) -> list[tuple[str, object]]:
        if isinstance(value, dict):
            return [i for k, v in value.items() for i in flat(f"{prefix}{k}.", v)]
        return [(prefix[:-1], value)]

    def shown(value) -> str:
        if isinstance(value, bool) or value is None:
            return str(value).lower() if isinstance(value, bool) else "-"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.1f}"
        if isinstance(value, list) and len(value) > 8:
            return f"[{len(value)} values]"
        return str(value)

    items = [i for k, v in values.items() for i in flat(f"{k}.", v)]
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join([f"[{tag}]"] + [f"  {k:<{width}}  {shown(v)}" for k, v in items])
