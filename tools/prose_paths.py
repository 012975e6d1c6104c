"""Names in prose, checked against the tree, so that what the README and the docs tell people to
open or run is there: every repo path named in a Markdown file, in the comments of params.yaml,
dvc.yaml and the Makefile, or in a docstring or comment under stages/ tests/ tools/ demo/ must be
a file or folder of the repo or an output of dvc.yaml; every `python -m` module of the project
must be runnable, with the options written after it; every other dotted name of the project
(`tests.doubles.hf_server`) must be a module or a name one defines; every `tests/....py::name`
must name a test of that file; every `make` target in backticks must be in the Makefile. Run by
`make check` and tests/stages/test_prose_paths.py.

    python tools/prose_paths.py      # print each wrong name with its file and line; exit 1 if any

Not checked, by design: paths outside the repo (absolute, ../shared, URLs, other packages'
sources), placeholders (`<dataset>`, `{train,eval}`, `*.sql`, `${key}`), and, beside the files
dvc.yaml writes, any file in a folder it writes to (`reports/canary.pt`): outputs by hand.
"""

from __future__ import annotations

import ast
import functools
import io
import posixpath
import re
import subprocess
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from structure import entry_path, imports, module_file, stage_bodies

# Where the project's Python prose lives, and the files whose `#` comments are prose.
PYTHON_DIRS = ("stages", "tests", "tools", "demo")
COMMENTED_FILES = ("params.yaml", "dvc.yaml", "Makefile")
# Folders whose insides belong to a tool (DVC's locks and caches), not to the repo.
TOOL_DIRS = {".dvc"}
# A dotted name ending in one of these is a file name (`stages.py`), not a module's.
FILE_SUFFIXES = {"py", "md", "yaml", "yml", "json", "sql", "toml", "txt", "jinja", "parquet"}

PATH = re.compile(r"(?<![\w@:/.~$-])(?:\.\.?/)?[\w.<>{}*$,-]+(?:/[\w.<>{}*$,-]*)+")
PLACEHOLDER = re.compile(r"<[^>]*>|\{[^}]*\}|\$\{[^}]*\}|\*|\.\.\.")
LINK = re.compile(r"\]\(([^)\s#]+)")
DOTTED = re.compile(r"(?<![\w./-])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?![\w/-])")
MODULE_RUN = re.compile(r"(?<![\w-])-m\s+([A-Za-z_][\w.<>{}]*)")
# A command's words after its module: up to the end of its code span, line or shell statement.
COMMAND_REST = re.compile(r"(?:[^`\n;|&#)\\]|\\\n|\\)*")
FLAG = re.compile(r"(?<![\w-])--([a-z][\w-]*)")
TEST_ID = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
MAKE_TARGET = re.compile(r"`make ([a-z][\w-]*)")
MAKEFILE_RULE = re.compile(r"^([\w.$()/ -]+?):(?!=)", re.MULTILINE)


@dataclass(frozen=True)
class Prose:
    """A piece of prose: its file, the line it starts on, its text."""

    file: str
    line: int
    text: str

    def line_of(self, offset: int) -> str:
        return f"{self.file}:{self.line + self.text.count(chr(10), 0, offset)}"


@dataclass(frozen=True)
class Tree:
    """What a name in prose may name: the repo's files and folders and dvc.yaml's outputs."""

    root: Path
    files: frozenset[str]
    dirs: frozenset[str]
    outs: tuple[tuple[str, ...], ...]
    packages: frozenset[str]

    @property
    def roots(self) -> set[str]:
        """The top-level folders: a path starting elsewhere is no repo path."""
        top = {d for d in self.dirs if "/" not in d} | {o[0] for o in self.outs}
        return top - TOOL_DIRS


def load_tree(root: Path) -> Tree:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    files = frozenset(f for f in listed if (root / f).is_file())
    dirs = frozenset(str(p) for f in files for p in Path(f).parents if str(p) != ".")
    packages = frozenset(d for d in dirs if "/" not in d and f"{d}/__init__.py" in files)
    return Tree(root, files, dirs, dvc_outs(root), packages)


def dvc_outs(root: Path) -> tuple[tuple[str, ...], ...]:
    """Every path dvc.yaml's stages write (outs, metrics, plots), split into its parts."""
    return tuple(
        tuple(entry_path(out).rstrip("/").split("/"))
        for body in stage_bodies(root).values()
        for kind in ("outs", "metrics", "plots")
        for out in body.get(kind, [])
    )


def prose(tree: Tree) -> Iterator[Prose]:
    """The Markdown files, the commented files' comments, the Python docstrings and comments."""
    for name in sorted(tree.files):
        path = tree.root / name
        if name.endswith(".md") and not is_output(tree, tuple(name.split("/"))):
            yield Prose(name, 1, path.read_text())
        elif name in COMMENTED_FILES:
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if (at := comment_start(line)) is not None:
                    yield Prose(name, number, line[at:])
        elif name.endswith(".py") and name.split("/")[0] in PYTHON_DIRS:
            yield from python_prose(name, path.read_text())


def comment_start(line: str) -> int | None:
    """Where a `#` comment starts in a YAML or Makefile line (a `#` after a blank or first)."""
    match = re.search(r"(?:^|\s)#", line)
    return match.end() - 1 if match else None


def python_prose(name: str, source: str) -> Iterator[Prose]:
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield Prose(name, first.lineno, first.value.value)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield Prose(name, token.start[0], token.string)


def component_pattern(part: str) -> re.Pattern[str]:
    """A path part as a pattern: each placeholder in it stands for any name."""
    pieces = PLACEHOLDER.split(part)
    return re.compile("[^/]*".join(re.escape(p) for p in pieces))


def parts_match(named: tuple[str, ...], known: tuple[str, ...]) -> bool:
    """Part by part, either side's placeholders standing for a name on the other."""
    return len(named) == len(known) and all(
        component_pattern(a).fullmatch(PLACEHOLDER.sub("x", b))
        or component_pattern(b).fullmatch(PLACEHOLDER.sub("x", a))
        for a, b in zip(named, known)
    )


def is_output(tree: Tree, parts: tuple[str, ...]) -> bool:
    """An output of dvc.yaml, a path under one, a folder holding one, or a file written by hand
    into a folder that holds one (its nearest folder that is the repo's or holds an output is
    the latter)."""
    if any(parts_match(parts[: len(o)], o[: len(parts)]) for o in tree.outs):
        return True
    for n in range(len(parts) - 1, 0, -1):
        if any(len(o) > n and parts_match(parts[:n], o[:n]) for o in tree.outs):
            return True
        if "/".join(parts[:n]) in tree.dirs:
            return False
    return False


def is_known(tree: Tree, path: str) -> bool:
    parts = tuple(path.removeprefix("./").rstrip("/").split("/"))
    joined = "/".join(parts)
    if joined in tree.files or joined in tree.dirs or is_output(tree, parts):
        return True
    return PLACEHOLDER.search(joined) is not None and any(
        parts_match(parts, tuple(known.split("/"))) for known in tree.files | tree.dirs
    )


def path_problems(tree: Tree, piece: Prose) -> Iterator[str]:
    for match in PATH.finditer(piece.text):
        path = match.group().rstrip(".,")
        if path.split("/")[0] in tree.roots and not is_known(tree, path):
            yield (
                f"{piece.line_of(match.start())}: {path} is no file or folder of the repo, nor "
                f"an output of dvc.yaml: name the path it has now"
            )
    if piece.file.endswith(".md"):
        for match in LINK.finditer(piece.text):
            target = match.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            path = posixpath.normpath(posixpath.join(posixpath.dirname(piece.file), target))
            if not path.startswith("../") and not is_known(tree, path):
                yield (
                    f"{piece.line_of(match.start())}: the link to {target} leads nowhere: "
                    f"link the file where it is now"
                )


def dotted_problems(tree: Tree, piece: Prose) -> Iterator[str]:
    """A dotted name of the project (`tests.doubles.hf_server`, `stages.params.schema.PARAMS_FILE`):
    its longest module prefix exists and defines the name after it."""
    for match in DOTTED.finditer(piece.text):
        parts = match.group().split(".")
        run = re.search(r"(?<![\w-])-m\s+$", piece.text[max(0, match.start() - 8) : match.start()])
        if parts[0] not in tree.packages or parts[-1] in FILE_SUFFIXES or run:
            continue  # `python -m NAME`: module_problems checks it
        n = max(i for i in range(1, len(parts) + 1) if module_file(tree.root, ".".join(parts[:i])))
        if n < len(parts) and parts[n] not in defined_names(tree, ".".join(parts[:n])):
            yield (
                f"{piece.line_of(match.start())}: {match.group()}: no such module or name "
                f"({'.'.join(parts[:n])} has no {parts[n]}): name it where it is now"
            )


@functools.cache
def defined_names(tree: Tree, module: str) -> frozenset[str]:
    """The names a module defines at its top level (functions, classes, assignments, imports)."""
    path = module_file(tree.root, module)
    names: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body if path else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return frozenset(names)


def module_problems(tree: Tree, piece: Prose) -> Iterator[str]:
    """`python -m` (or `torchrun -m`) of a project module: runnable, and taking its options."""
    for match in MODULE_RUN.finditer(piece.text):
        module = match.group(1).rstrip(".")
        if module.split(".")[0] not in tree.packages or PLACEHOLDER.search(module):
            continue
        where = piece.line_of(match.start())
        base = Path(*module.split("."))
        if f"{base}.py" not in tree.files and f"{base}/__main__.py" not in tree.files:
            yield f"{where}: python -m {module}: no such module (no {base}.py): name its module"
            continue
        rest = COMMAND_REST.match(piece.text, match.end())
        taken = module_options(tree, module)
        for flag in FLAG.findall(rest.group() if rest else ""):
            if f"--{flag}" not in taken and f"--{flag.removeprefix('no-')}" not in taken:
                yield f"{where}: python -m {module} takes no option --{flag} (see its --help)"


@functools.cache
def module_options(tree: Tree, module: str) -> frozenset[str]:
    """The options a module's command line takes: each `--name` string its code (or project
    code it imports) spells out, and the parameters of its `main` (typer makes them options)."""
    options = {"--help"}
    for name in {module} | imports(tree.root, module, packages=tree.packages):
        path = module_file(tree.root, name)
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                options.update(re.findall(r"--[\w-]+", node.value))
            elif name == module and isinstance(node, ast.FunctionDef) and node.name == "main":
                args = node.args.args + node.args.kwonlyargs
                options.update("--" + a.arg.replace("_", "-") for a in args)
    return frozenset(options)


def test_id_problems(tree: Tree, piece: Prose) -> Iterator[str]:
    for match in TEST_ID.finditer(piece.text):
        path, name = match.groups()
        if path in tree.files:
            source = (tree.root / path).read_text()
            if not re.search(rf"^\s*(?:async )?(?:def|class) {name}\b", source, re.MULTILINE):
                yield (
                    f"{piece.line_of(match.start())}: {path} defines no test {name}: name one "
                    f"it defines"
                )


def make_problems(tree: Tree, piece: Prose, targets: set[str]) -> Iterator[str]:
    for match in MAKE_TARGET.finditer(piece.text):
        if match.group(1) not in targets:
            yield (
                f"{piece.line_of(match.start())}: make {match.group(1)}: no such target of the "
                f"Makefile: name one it has"
            )


def makefile_targets(root: Path) -> set[str]:
    text = (root / "Makefile").read_text()
    return {t for rule in MAKEFILE_RULE.findall(text) for t in rule.split()}


def problems(root: Path) -> list[str]:
    """Every wrong name, as `file:line: what`, by file and line."""
    tree = load_tree(root)
    targets = makefile_targets(root)
    found: list[str] = []
    for piece in prose(tree):
        found += path_problems(tree, piece)
        found += dotted_problems(tree, piece)
        found += module_problems(tree, piece)
        found += test_id_problems(tree, piece)
        found += make_problems(tree, piece, targets)
    return sorted(found, key=place)


def place(problem: str) -> tuple[str, int]:
    """The file and line a problem (`file:line: what`) names, to sort by."""
    file, line, _ = problem.split(":", 2)
    return file, int(line)


def main() -> int:
    found = problems(Path(__file__).resolve().parent.parent)
    for problem in found:
        print(problem)
    print(f"prose paths: {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
