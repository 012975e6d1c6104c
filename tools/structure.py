"""The project's structure, checked: dvc.yaml's code deps against what each stage really imports,
the library's layering, the stage side's shape (the top level holds the stage modules and
their plumbing; no stage imports another; commands and factories in packages of their own), and
no function longer than MAX_FUNCTION_LINES. Run by `make check` and tests/stages/test_structure.py.

    python tools/structure.py           # print problems; exit 1 if any
    python tools/structure.py --deps    # print each stage's code deps, as dvc.yaml should list them
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import yaml

PACKAGE = "stages"
# Library packages and the library packages each may import (besides itself). The top-level
# modules of `stages` (the stage modules, cli) and STAGE_SIDE_PACKAGES (params, wiring, commands)
# are the stage side: no library module may import them.
LAYERS: dict[str, set[str]] = {
    "runtime": set(),
    "queries": set(),
    "sources": {"runtime"},
    "artifacts": {"runtime"},
    "target_model": {"runtime"},
    "drafter": {"runtime", "artifacts"},
    "dflash": {"runtime", "artifacts", "drafter"},
    "engines": {"runtime", "artifacts", "target_model", "drafter"},
    "serving": {"runtime", "artifacts", "engines", "reports"},
    "capture": {"runtime", "target_model", "drafter", "engines"},
    "reports": {"runtime"},
    "reporting": {"target_model", "reports"},
}
# The stage side besides the stage modules: plumbing every stage may import, the typed params
# (stages/params/, one module per section), the factories that build library objects from params
# (stages/wiring/), and the commands run by hand (stages/commands/), which may import stages but
# no stage imports them.
PLUMBING = {"cli"}
STAGE_SIDE_PACKAGES = {"params", "wiring", "commands"}
# The longest function (from `def` to its last line) the package holds: an orchestrator longer
# than this reads better as named steps.
MAX_FUNCTION_LINES = 60


def module_file(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(
    root: Path, module: str, parents: bool = True, packages: frozenset[str] = frozenset({PACKAGE})
) -> set[str]:
    """Modules of `packages` that `module` imports anywhere in its file (function-level imports
    too), with (`parents`) the packages they sit in: Python runs those `__init__` files first."""
    path = module_file(root, module)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in packages and module_file(root, name):
                parts = name.split(".")
                found.update(
                    ".".join(parts[:i]) for i in range(1 if parents else len(parts), len(parts) + 1)
                )
    found.discard(module)
    return found


def closure(root: Path, module: str) -> set[str]:
    seen, todo = {module}, [module]
    while todo:
        for dep in imports(root, todo.pop()) - seen:
            seen.add(dep)
            todo.append(dep)
    return seen


def needed_files(root: Path, module: str) -> set[str]:
    """Every project file the stage module runs: its modules and the SQL files they name."""
    files = set()
    for m in closure(root, module):
        path = module_file(root, m)
        if m == PACKAGE:
            continue
        files.add(path.relative_to(root).as_posix())
        files.update(named_queries(root, path))
    return files


def named_queries(root: Path, path: Path) -> set[str]:
    """The SQL files a module runs: those named in a call of `sql` or `rows`, and every name of
    a module-level list of them (a stage's questions)."""
    tree = ast.parse(path.read_text(), str(path))

    def sql_file(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            sql = root / PACKAGE / "queries" / f"{node.value}.sql"
            if node.value.isidentifier() and sql.exists():
                return sql.relative_to(root).as_posix()
        return None

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in ("sql", "rows"):
                found.update(f for arg in node.args if (f := sql_file(arg)))
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Tuple, ast.List)):
            files = [sql_file(e) for e in stmt.value.elts]
            if files and all(files):
                found.update(f for f in files if f)
    return found


def stage_bodies(root: Path) -> dict[str, dict]:
    """{stage name: its body} from dvc.yaml (a foreach stage's `do`)."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    return {name: spec.get("do", spec) for name, spec in stages.items()}


def entry_path(entry: str | dict) -> str:
    """The path of a deps / outs / metrics / plots entry (a plain path, or one with options)."""
    return entry if isinstance(entry, str) else next(iter(entry))


def stage_modules(root: Path) -> dict[str, tuple[str, list[str]]]:
    """{stage name: (module its cmd runs, its deps)} from dvc.yaml."""
    out = {}
    for name, body in stage_bodies(root).items():
        match = re.search(r"python -m ([\w.]+)", body["cmd"])
        if match:
            out[name] = (match.group(1), [entry_path(d) for d in body.get("deps", [])])
    return out


def dvc_dep_problems(root: Path) -> list[str]:
    problems = []
    for name, (module, deps) in stage_modules(root).items():
        if module_file(root, module) is None:
            problems.append(f"dvc.yaml stage {name}: its cmd runs {module}, which does not exist")
            continue
        code_deps = [d.rstrip("/") for d in deps if d.startswith(f"{PACKAGE}/")]
        for dep in code_deps:
            if not (root / dep).exists():
                problems.append(f"dvc.yaml stage {name}: dep {dep} does not exist")
        needed = needed_files(root, module)
        for path in sorted(needed):
            if not any(path == d or path.startswith(d + "/") for d in code_deps):
                problems.append(
                    f"dvc.yaml stage {name}: {module} runs {path}, which is not "
                    f"among its deps (a change to it would rerun nothing)"
                )
        for dep in code_deps:
            if (root / dep).exists() and dep not in needed:
                problems.append(
                    f"dvc.yaml stage {name}: dep {dep} is not a file {module} runs (an edit "
                    f"to it would rerun the stage for nothing): drop it, or name the files"
                )
    return problems


def layer_problems(root: Path) -> list[str]:
    problems = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        module = module_name(root, path)
        parts = module.split(".")
        if (
            len(parts) < 2
            or parts[1] not in LAYERS
            and module_file(root, module).name != "__init__.py"
            and len(parts) == 2
        ):
            continue  # a stage-side top-level module: may import anything
        if len(parts) < 2 or parts[1] not in LAYERS:
            if len(parts) > 1 and parts[1] in STAGE_SIDE_PACKAGES:
                continue
            if len(parts) > 1 and (root / PACKAGE / parts[1]).is_dir():
                problems.append(
                    f"{path.relative_to(root)}: package {parts[1]} is not in "
                    f"tools/structure.py LAYERS; say what it may import"
                )
            continue
        allowed = LAYERS[parts[1]] | {parts[1]}
        named = imports(root, module, parents=False)
        for dep in sorted(d for d in named if not any(o.startswith(d + ".") for o in named)):
            dep_parts = dep.split(".")
            if dep == PACKAGE:
                continue
            stage_side = dep_parts[1] in STAGE_SIDE_PACKAGES
            if stage_side or len(dep_parts) == 2 and not (root / PACKAGE / dep_parts[1]).is_dir():
                problems.append(
                    f"{path.relative_to(root)}: the library imports the stage-side "
                    f"module {dep}; pass values in as arguments instead"
                )
            elif dep_parts[1] not in allowed:
                problems.append(
                    f"{path.relative_to(root)}: {parts[1]} may import {sorted(allowed)}, not {dep}"
                )
    return problems


def stage_side_problems(root: Path) -> list[str]:
    """The top level holds stage modules (those dvc.yaml runs) and PLUMBING only; no stage module
    and no factory imports a stage module or a command."""
    stages = {module for module, _ in stage_modules(root).values()}
    problems = []
    for path in sorted((root / PACKAGE).glob("*.py")):
        module = module_name(root, path)
        if path.name != "__init__.py" and module not in stages and path.stem not in PLUMBING:
            problems.append(
                f"{path.relative_to(root)}: neither a stage dvc.yaml runs nor plumbing "
                f"({sorted(PLUMBING)}); a command goes in {PACKAGE}/commands/, a factory in "
                f"{PACKAGE}/wiring/, library code in its package"
            )
    importers = sorted(stages) + [
        module_name(root, p) for p in sorted((root / PACKAGE / "wiring").glob("*.py"))
    ]
    for module in importers:
        for dep in sorted(imports(root, module, parents=False)):
            if dep != module and (dep in stages or dep.startswith(f"{PACKAGE}.commands")):
                problems.append(
                    f"{module_file(root, module).relative_to(root)}: imports {dep}; a stage "
                    f"imports no other stage and no command: move what they share to "
                    f"{PACKAGE}/wiring/ (objects from params) or a library package"
                )
    return problems


def length_problems(root: Path) -> list[str]:
    """Functions of the package longer than MAX_FUNCTION_LINES."""
    problems = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    problems.append(
                        f"{path.relative_to(root)}:{node.lineno}: {node.name} is {lines} lines "
                        f"(at most {MAX_FUNCTION_LINES}); split it into named steps"
                    )
    return problems


def main(argv: list[str]) -> int:
    root = Path(__file__).resolve().parent.parent
    if "--deps" in argv:
        for name, (module, _) in stage_modules(root).items():
            print(f"{name}:")
            for path in sorted(needed_files(root, module)):
                print(f"  - {path}")
        return 0
    problems = (
        dvc_dep_problems(root)
        + layer_problems(root)
        + stage_side_problems(root)
        + length_problems(root)
    )
    for p in problems:
        print(p)
    print(f"structure: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
