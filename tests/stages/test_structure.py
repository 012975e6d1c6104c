"""The structure checks of `make check` (tools/structure.py): each passes on the tree and fails
on a planted violation of what it guards."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.project import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import structure  # noqa: E402


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the package and dvc.yaml to plant violations in."""
    shutil.copytree(
        ROOT / "stages", tmp_path / "stages", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    return tmp_path


def plant(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


@pytest.mark.slow
def test_the_tree_has_no_problem():
    assert structure.dvc_dep_problems(ROOT) == []
    assert structure.layer_problems(ROOT) == []
    assert structure.stage_side_problems(ROOT) == []
    assert structure.length_problems(ROOT) == []


@pytest.mark.slow
def test_an_import_dvc_yaml_does_not_list_is_caught(tree):
    assert structure.dvc_dep_problems(tree) == []
    plant(tree / "stages" / "vocab.py", "from .target_model import weights")
    problems = structure.dvc_dep_problems(tree)
    assert problems == [
        f"dvc.yaml stage vocab: stages.vocab runs stages/target_model/{name}, which "
        f"is not among its deps (a change to it would rerun nothing)"
        for name in ("__init__.py", "weights.py")
    ]


@pytest.mark.slow
def test_a_dep_the_stage_does_not_run_is_caught(tree):
    """An extra code dep reruns the stage on every edit of that file for nothing."""
    dvc = tree / "dvc.yaml"
    dvc.write_text(
        dvc.read_text().replace(
            "- stages/merge.py\n", "- stages/merge.py\n      - stages/params/train.py\n", 1
        )
    )
    assert structure.dvc_dep_problems(tree) == [
        "dvc.yaml stage merge: dep stages/params/train.py is not a file stages.merge runs (an "
        "edit to it would rerun the stage for nothing): drop it, or name the files"
    ]


@pytest.mark.slow
def test_an_import_inside_a_function_counts(tree):
    plant(tree / "stages" / "merge.py", "def later():\n    from .drafter import model")
    assert any(
        "stage merge" in p and "stages/drafter/model.py" in p
        for p in structure.dvc_dep_problems(tree)
    )


@pytest.mark.parametrize(
    "line",
    [
        "QUESTION = sql('finish_reasons')",
        "ANSWER = rows(duckdb.connect(), 'finish_reasons', n=3)",  # a call among the arguments
        "QUESTIONS = ('budget_used', 'finish_reasons')",  # a stage's list of questions
    ],
)
@pytest.mark.slow
def test_a_query_file_a_stage_names_must_be_listed(tree, line):
    plant(tree / "stages" / "vocab.py", line)
    assert any("stages/queries/finish_reasons.sql" in p for p in structure.dvc_dep_problems(tree))


def test_a_word_that_is_also_a_query_name_is_not_a_query():
    """A report key such as "samples" beside other words names no SQL file."""
    module = ROOT / "stages" / "merge.py"
    assert "stages/queries/duplicates.sql" not in structure.named_queries(ROOT, module)
    assert '"duplicates"' in module.read_text()  # the word is there, as a count's name


@pytest.mark.parametrize(
    "module, line, needle",
    [
        (
            "engines/sglang_http.py",
            "from ..params import train",
            "the library imports the stage-side module stages.params",
        ),
        (
            "drafter/model.py",
            "from ..wiring import params_key",
            "the library imports the stage-side module stages.wiring",
        ),
        ("runtime/files.py", "from ..artifacts import raw", "runtime may import ['runtime'], not "),
        (
            "target_model/tokens.py",
            "from ..engines import Sampling",
            "target_model may import ['runtime', 'target_model'], not stages.engines",
        ),
    ],
)
def test_a_layering_violation_is_caught(tree, module, line, needle):
    assert structure.layer_problems(tree) == []
    plant(tree / "stages" / module, line)
    problems = structure.layer_problems(tree)
    assert len(problems) == 1 and needle in problems[0], problems


@pytest.mark.slow
def test_a_new_library_package_must_declare_its_layer(tree):
    (tree / "stages" / "newpkg").mkdir()
    (tree / "stages" / "newpkg" / "__init__.py").write_text('"""x"""\n')
    assert any(
        "package newpkg is not in tools/structure.py LAYERS" in p
        for p in structure.layer_problems(tree)
    )


@pytest.mark.parametrize(
    "where, line, needle",
    [
        ("train.py", "from .extract import extract", "stages/train.py: imports stages.extract"),
        ("report.py", "from .quality import gate", "stages/report.py: imports stages.quality"),
        ("prep.py", "from .commands import query", "stages/prep.py: imports stages.commands"),
        ("wiring/engines.py", "from ..generate import main", "imports stages.generate"),
    ],
)
def test_a_stage_importing_a_stage_or_a_command_is_caught(tree, where, line, needle):
    assert structure.stage_side_problems(tree) == []
    plant(tree / "stages" / where, line)
    problems = structure.stage_side_problems(tree)
    assert any(needle in p for p in problems), problems


def test_a_top_level_module_that_is_no_stage_is_caught(tree):
    (tree / "stages" / "helpers.py").write_text('"""x"""\n')
    problems = structure.stage_side_problems(tree)
    assert any(
        "stages/helpers.py: neither a stage dvc.yaml runs nor plumbing" in p for p in problems
    )


@pytest.mark.slow
def test_a_function_over_the_length_limit_is_caught(tree):
    assert structure.length_problems(tree) == []
    body = "".join(f"    x{i} = {i}\n" for i in range(structure.MAX_FUNCTION_LINES - 1))
    plant(tree / "stages" / "merge.py", f"def long_step():\n{body}")
    assert structure.length_problems(tree) == []  # def + 59 lines: at the limit
    plant(tree / "stages" / "merge.py", f"def longer_step():\n{body}    x = 0")
    problems = structure.length_problems(tree)
    assert len(problems) == 1 and "longer_step is 61 lines (at most 60)" in problems[0]


def stages_depending_on(path: str) -> set[str]:
    return {name for name, (_, deps) in structure.stage_modules(ROOT).items() if path in deps}


@pytest.mark.parametrize(
    "module, stages",
    [
        ("stages/params/train.py", {"check", "train", "report"}),
        # the loop's keys, which `train` and `dflash` both hold
        # extract reads the dflash section (the layers DFlash reads), whose keys are LoopKnobs'
        ("stages/drafter/knobs.py", {"check", "extract", "train", "train_dflash", "report"}),
        ("stages/params/dflash.py", {"check", "extract", "train_dflash"}),
        # both train stages read extract's engine (extract.store none: online)
        ("stages/params/extract.py", {"check", "extract", "train", "train_dflash"}),
        ("stages/params/benchmark.py", {"check", "benchmark", "benchmark_dflash"}),
        ("stages/params/merge.py", {"check", "merge"}),
        ("stages/params/vocab.py", {"check", "vocab"}),
    ],
)
def test_an_edit_to_one_sections_code_reruns_the_stages_that_read_it(module, stages):
    """dvc.yaml's code deps are the imports (test_the_tree_has_no_problem), so these are the
    stages `dvc status` lists after an edit of the module: the check and the section's readers."""
    assert stages_depending_on(module) == stages


def test_the_plumbing_every_stage_shares_is_small():
    """What every stage depends on: the entry point, the error types, the params' shared schema
    and its field declaration, the type checks params and reports share, and the atomic writes;
    no engine, no other section, no serving code."""
    every = set(structure.stage_modules(ROOT))
    shared = {
        dep
        for _, deps in structure.stage_modules(ROOT).values()
        for dep in deps
        if stages_depending_on(dep) == every and dep.startswith("stages/")
    }
    assert shared <= {
        "stages/__init__.py",
        "stages/cli.py",
        "stages/runtime/__init__.py",
        "stages/runtime/errors.py",
        "stages/runtime/fields.py",
        "stages/runtime/files.py",
        "stages/runtime/typed.py",
        "stages/params/__init__.py",
        "stages/params/schema.py",
        "stages/reports/__init__.py",
        "stages/reports/record.py",
    }, shared
