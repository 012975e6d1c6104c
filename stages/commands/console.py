"""`eagle-pipeline`: what people run by hand, in one command. The stages themselves run from
dvc.yaml (`dvc repro`), each as `python -m stages.<stage>`.

    eagle-pipeline query [QUESTION] [--sql SQL] [--dataset D] [--csv | --json]
    eagle-pipeline report            # the report stage's command from dvc.yaml, outside DVC
    eagle-pipeline estimate          # projected generation hours per dataset
    eagle-pipeline launch-line       # the SGLang launch line from params (--drafter: speculative)
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from ..cli import StageError
from ..engines import EngineError
from ..params.benchmark import BenchmarkParams
from ..params.generate import GenerateParams
from ..params.schema import PARAMS_FILE
from ..params.server import SGLangLaunchParams
from ..params.target import TargetParams
from . import estimate, query

# Each command imports what it runs inside its function, so `eagle-pipeline --help` (and each
# command's --help) answers without loading torch or transformers.

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="The EAGLE-3 pipeline's commands run by hand (`dvc repro` runs the stages).",
)
app.command("query")(query.main)
app.command("estimate")(estimate.main)


def stage_args(dvc_file: Path, stage: str, module: str) -> list[str]:
    """The options dvc.yaml's `stage` passes to `python -m module` (paths live in dvc.yaml)."""
    stages = yaml.safe_load(dvc_file.read_text())["stages"]
    if stage not in stages:
        raise StageError(f"{dvc_file}: no stage {stage}")
    words = shlex.split(stages[stage]["cmd"])
    return words[words.index(module) + 1 :]


@app.command()
def report(
    dvc_file: Annotated[Path, typer.Option(help="the pipeline file naming its paths")] = Path(
        "dvc.yaml"
    ),
) -> None:
    """Rebuild the HTML report, metrics and model card from the current artifacts.

    The report stage's command with its paths from dvc.yaml, run outside DVC (`dvc repro
    report` records its run; `dvc commit -f report` adopts a result made here).
    """
    from .. import report as report_stage

    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command()(report_stage.main)
    typer.main.get_command(single).main(
        stage_args(dvc_file, "report", "stages.report"), standalone_mode=False
    )


@app.command("launch-line")
def launch_line(
    drafter: Annotated[
        Path | None, typer.Option(help="add the speculative flags for this drafter")
    ] = None,
    params: Annotated[Path, typer.Option(help="the params file")] = PARAMS_FILE,
) -> None:
    """Print the SGLang launch line that params give.

    generate.sglang.launch (else SGLang's defaults) serving the target; with --drafter, its
    speculative flags added: a DFlash export's (DFLASH, at the block size it was trained with),
    else EAGLE-3's at the benchmark's chain (benchmark.num_steps).
    """
    from ..wiring.engines import server_command

    gen = GenerateParams.read(params)
    target = TargetParams.read(params)
    served = (gen.sglang.launch and gen.sglang.launch.model_path) or target.path
    if not Path(served).is_dir():
        key = "generate.sglang.launch.model_path" if served != target.path else "target.path"
        raise StageError(f"{key}: {served} is no directory; the server would fail to load it")
    if drafter is not None and not (drafter / "config.json").is_file():
        raise StageError(f"--drafter {drafter}: no config.json there; give the exported drafter")
    command = server_command(gen.sglang.launch or SGLangLaunchParams(), target)
    if drafter is not None:
        command += speculation(drafter, params).args()
    print(shlex.join(command))


def speculation(drafter: Path, params: Path):
    """How SGLang serves the export in `drafter`: by the family its config.json names."""
    from ..dflash.export import ARCHITECTURE, sglang_view
    from ..serving.launch import Speculation

    config = json.loads((drafter / "config.json").read_text())
    if config.get("architectures") == [ARCHITECTURE]:
        return Speculation.dflash(drafter, sglang_view(config).block_size)
    return Speculation.eagle3(drafter, BenchmarkParams.read(params).num_steps)


def main() -> None:
    """The console script: expected errors end with one line, as the stages' do."""
    try:
        app(standalone_mode=False)
    except (StageError, EngineError, ValueError, FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except Exception as err:  # click usage errors and the like (typer vendors click)
        if type(err).__module__.startswith(("click", "typer")):
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
