"""A supported SGLang release read from its own source, without importing it.

`make sglang-releases` unpacks each supported release's wheel (the whole Python package) under
`.sglang-releases/<version>/sglang/`, a folder no import path reaches. Everything here reads those
files with `ast`: which modules and names exist, the parameters of a callable (a class's
`__init__`, synthesized ones of dataclasses and msgspec Structs included), the attributes a class
sets, its enum members, and a method's source to run on its own. SGLang's GPU dependencies are
never needed.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / ".sglang-releases"


def release_root(version: str) -> Path:
    return RELEASES / version


def missing_reason(version: str) -> str | None:
    """Why the release cannot be read here, or None."""
    if (release_root(version) / "sglang" / "__init__.py").exists():
        return None
    return (
        f"SGLang {version}'s source is not under {release_root(version)}: run "
        f"`make sglang-releases` (pip download --no-deps from the registry)"
    )


@dataclass(frozen=True)
class Param:
    name: str
    kind: str  # positional_only | positional | keyword_only | var_positional | var_keyword
    required: bool

    def __str__(self) -> str:
        star = {"var_positional": "*", "var_keyword": "**"}.get(self.kind, "")
        return f"{star}{self.name}{'' if self.required or star else '=...'}"


def function_params(node: ast.FunctionDef | ast.AsyncFunctionDef, *, bound: bool) -> list[Param]:
    """The parameters of a def; `bound` drops the first (self or cls)."""
    a = node.args
    positional = [(p, "positional_only") for p in a.posonlyargs] + [
        (p, "positional") for p in a.args
    ]
    first_default = len(positional) - len(a.defaults)
    params = [Param(p.arg, kind, i < first_default) for i, (p, kind) in enumerate(positional)]
    if a.vararg:
        params.append(Param(a.vararg.arg, "var_positional", False))
    for p, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(Param(p.arg, "keyword_only", default is None))
    if a.kwarg:
        params.append(Param(a.kwarg.arg, "var_keyword", False))
    return params[1:] if bound and params and params[0].kind != "keyword_only" else params


def call_problems(params: list[Param], positional: int, keywords: list[str], star: bool) -> list:
    """What is wrong with a call of `positional` arguments and `keywords` to `params`;
    `star`: the call spreads *args or **kwargs, so only the named keywords can be checked."""
    problems = []
    by_name = {p.name: p for p in params if p.kind not in ("var_positional", "var_keyword")}
    takes_any_keyword = any(p.kind == "var_keyword" for p in params)
    slots = [p for p in params if p.kind in ("positional_only", "positional")]
    if positional > len(slots) and not any(p.kind == "var_positional" for p in params):
        problems.append(f"{positional} positional arguments, the callee takes {len(slots)}")
    given = {p.name for p in slots[:positional]}
    for k in keywords:
        p = by_name.get(k)
        if (p is None or p.kind == "positional_only") and not takes_any_keyword:
            problems.append(f"keyword {k!r} is no parameter of the callee")
        given.add(k)
    if not star:
        missing = [p.name for p in params if p.required and p.name not in given]
        if missing:
            problems.append(f"required parameter(s) {missing} not given")
    return problems


class Release:
    """One release's source tree: `root/sglang/...`."""

    def __init__(self, version: str, root: Path | None = None, extra: dict | None = None):
        """`extra`: modules outside `sglang` to read too, by dotted name (a stand-in's shared
        core), followed like the release's own."""
        self.version = version
        self.root = Path(root) if root else release_root(version)
        self.extra: dict[str, Path] = dict(extra or {})

    def _key(self) -> tuple:
        return (self.version, self.root, tuple(sorted(self.extra.items())))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Release) and self._key() == other._key()

    # --- modules and names ----------------------------------------------------------------

    def module_file(self, dotted: str) -> Path | None:
        if dotted in self.extra:
            return self.extra[dotted]
        base = self.root.joinpath(*dotted.split("."))
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None

    def module(self, dotted: str) -> Module | None:
        return _module(self, dotted)

    def is_namespace(self, dotted: str) -> bool:
        """A folder without __init__.py: a namespace package (sglang.srt is one)."""
        return self.root.joinpath(*dotted.split(".")).is_dir() and self.module_file(dotted) is None

    def lookup(self, dotted: str, name: str, depth: int = 0) -> Symbol | None:
        """What `name` is in module `dotted`: a def, a class, a value or an import followed to
        its definition inside the release (a name imported from outside stays `external`)."""
        module = self.module(dotted)
        if module is None or depth > 20:
            return None
        node = module.names.get(name)
        if node is None:
            if self.module_file(f"{dotted}.{name}"):  # a submodule
                return Symbol("module", f"{dotted}.{name}", None, self)
            lazy = module.lazy.get(name)
            return self.lookup(lazy, name, depth + 1) if lazy else None
        if isinstance(node, ast.ImportFrom):
            source = _absolute(dotted, node, module.is_package)
            alias = next(a for a in node.names if (a.asname or a.name) == name)
            if not source.startswith("sglang") and source not in self.extra:
                return Symbol("external", f"{source}.{alias.name}", None, self)
            return self.lookup(source, alias.name, depth + 1)
        if isinstance(node, ast.Import):
            alias = next(a for a in node.names if (a.asname or a.name).split(".")[0] == name)
            return Symbol(
                "external" if not alias.name.startswith("sglang") else "module",
                alias.name if alias.asname else name,
                None,
                self,
            )
        if isinstance(node, ast.ClassDef):
            return Symbol("class", f"{dotted}.{name}", node, self)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return Symbol("function", f"{dotted}.{name}", node, self)
        return Symbol("value", f"{dotted}.{name}", node, self)

    def cls(self, dotted: str, name: str) -> Class:
        symbol = self.lookup(dotted, name)
        if symbol is None or symbol.kind != "class":
            raise LookupError(f"SGLang {self.version}: {dotted}.{name} is no class")
        return Class(symbol)


@dataclass(frozen=True)
class Module:
    dotted: str
    tree: ast.Module
    is_package: bool
    names: dict  # top-level name -> the node that binds it (last binding wins)
    lazy: dict  # name -> module, from a `_LAZY_REEXPORTS`-style table served by __getattr__


@cache
def _module(release: Release, dotted: str) -> Module | None:
    path = release.module_file(dotted)
    if path is None:
        if release.is_namespace(dotted):
            return Module(dotted, ast.Module([], []), True, {}, {})
        return None
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: dict = {}
    lazy: dict = {}

    def bind(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names[node.name] = node
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    names[alias.asname or alias.name] = node
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for n in ast.walk(target):
                        # a class rebound by a call keeps its body as its definition (0.5.23:
                        # `ServerArgs = msgspec.defstruct(..., namespace=vars(ServerArgs))`)
                        if isinstance(n, ast.Name) and not isinstance(
                            names.get(n.id), ast.ClassDef
                        ):
                            names[n.id] = node
                if isinstance(node, ast.Assign) and _is_lazy_table(node):
                    assert isinstance(node.value, ast.Dict)
                    for k, v in zip(node.value.keys, node.value.values):
                        if isinstance(k, ast.Constant) and isinstance(v, ast.Constant):
                            lazy[k.value] = v.value
            elif isinstance(node, ast.If | ast.Try):
                bind(node.body)
                bind(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    bind(handler.body)

    bind(tree.body)
    return Module(dotted, tree, path.name == "__init__.py", names, lazy)


def _is_lazy_table(node: ast.Assign) -> bool:
    return (
        isinstance(node.value, ast.Dict)
        and any(isinstance(t, ast.Name) and "LAZY" in t.id for t in node.targets)
        and all(isinstance(v, ast.Constant) for v in node.value.values)
    )


def _absolute(dotted: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = dotted.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


@dataclass(frozen=True)
class Symbol:
    kind: str  # module | class | function | value | external
    qualname: str
    node: ast.AST | None
    release: Release

    @property
    def module(self) -> str:
        return self.qualname.rsplit(".", 1)[0]


class Class:
    """A class of the release, its bases followed inside the release."""

    def __init__(self, symbol: Symbol):
        assert isinstance(symbol.node, ast.ClassDef)
        self.symbol = symbol
        self.node: ast.ClassDef = symbol.node
        self.release = symbol.release
        self.name = self.node.name

    def __repr__(self) -> str:
        return f"<SGLang {self.release.version} class {self.symbol.qualname}>"

    # --- hierarchy ------------------------------------------------------------------------

    def bases(self) -> list[Class | str]:
        """Base classes inside the release as Class, others as their dotted name."""
        out: list[Class | str] = []
        for base in self.node.bases:
            text = ast.unparse(base)
            head, _, rest = text.partition(".")
            symbol = self.release.lookup(self.symbol.module, head)
            if symbol is not None and symbol.kind == "module" and rest:
                symbol = self.release.lookup(symbol.qualname, rest)
            elif symbol is not None and rest and symbol.kind == "external":
                out.append(f"{symbol.qualname}.{rest}")
                continue
            if symbol is not None and symbol.kind == "class":
                out.append(Class(symbol))
            else:
                out.append(symbol.qualname if symbol is not None else text)
        return out

    def mro(self) -> list[Class]:
        seen, order = set(), []

        def walk(c: Class) -> None:
            if c.symbol.qualname in seen:
                return
            seen.add(c.symbol.qualname)
            order.append(c)
            for b in c.bases():
                if isinstance(b, Class):
                    walk(b)

        walk(self)
        return order

    def external_bases(self) -> list[str]:
        return [b for c in self.mro() for b in c.bases() if isinstance(b, str)]

    # --- kinds ----------------------------------------------------------------------------

    def decorators(self) -> list[str]:
        return [ast.unparse(d) for d in self.node.decorator_list]

    @property
    def is_dataclass(self) -> bool:
        return any(d.split("(")[0].split(".")[-1] == "dataclass" for d in self.decorators())

    @property
    def is_struct(self) -> bool:
        return any("Struct" in b for b in self.external_bases())

    @property
    def is_enum(self) -> bool:
        return any(b.split(".")[-1].endswith("Enum") for b in self.external_bases())

    # --- members --------------------------------------------------------------------------

    def own_method(self, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        for node in self.node.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
                return node
        return None

    def method(self, name: str) -> tuple[Class, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        for c in self.mro():
            node = c.own_method(name)
            if node is not None:
                return c, node
        return None

    def method_params(self, name: str) -> list[Param] | None:
        if name == "__init__":
            return self.init_params()
        found = self.method(name)
        if found is None:
            return None
        _, node = found
        decorators = {ast.unparse(d) for d in node.decorator_list}
        return function_params(node, bound="staticmethod" not in decorators)

    def fields(self) -> list[tuple[str, bool, bool]]:
        """(name, has_default, init) of the declared fields, bases first: what a dataclass or
        Struct constructor takes. `_INPUT_NAMESPACES`-assembled classes (0.5.23's ServerArgs)
        take the fields of every namespace the release lists for them."""
        out: dict[str, tuple[str, bool, bool]] = {}
        for c in reversed(self.mro()):
            for namespace in c.assembled_from():
                for f in namespace.fields():
                    out[f[0]] = f
            for node in c.node.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    annotation = ast.unparse(node.annotation)
                    if "ClassVar" in annotation:
                        continue
                    name, value = node.target.id, node.value
                    init = not (
                        isinstance(value, ast.Call)
                        and any(
                            k.arg == "init" and ast.unparse(k.value) == "False"
                            for k in value.keywords
                        )
                    )
                    has_default = value is not None and not (
                        isinstance(value, ast.Call)
                        and ast.unparse(value.func).split(".")[-1] == "field"
                        and not any(k.arg in ("default", "default_factory") for k in value.keywords)
                    )
                    out[name] = (name, has_default, init)
        return list(out.values())

    def assembled_from(self) -> list[Class]:
        """The namespaces a module's `_INPUT_NAMESPACES` list assembles into this class."""
        module = self.release.module(self.symbol.module)
        if module is None or "_INPUT_NAMESPACES" not in module.names:
            return []
        table = module.names["_INPUT_NAMESPACES"]
        if not isinstance(table, ast.Assign) or not isinstance(table.value, ast.List):
            return []
        if not any(_assigns(n, self.name) for n in module.tree.body):
            return []
        return [
            self.release.cls(self.symbol.module, ast.unparse(element))
            for element in table.value.elts
        ]

    def init_params(self) -> list[Param] | None:
        """What calling the class takes: its `__init__` (the nearest in the release's MRO), or
        the synthesized one of a dataclass or Struct; None where it comes from outside."""
        for c in self.mro():
            node = c.own_method("__init__")
            if node is not None:
                return function_params(node, bound=True)
            if c.is_dataclass or c.is_struct or c.assembled_from():
                kw_only = any("kw_only=True" in d for d in c.decorators()) or any(
                    k.arg == "kw_only" and ast.unparse(k.value) == "True" for k in c.node.keywords
                )
                kind = "keyword_only" if kw_only else "positional"
                return [Param(n, kind, not d) for n, d, init in self.fields() if init]
        return None

    def attributes(self) -> frozenset[str]:
        """Every name the class or a base in the release defines or sets on `self`."""
        return _attributes(self.release, self.symbol.qualname)

    def _attributes(self) -> frozenset[str]:
        names: set[str] = set()
        for c in self.mro():
            names |= {n for n, _, _ in c.fields()}
            for node in c.node.body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, ast.Assign):
                    names |= {n.id for t in node.targets for n in ast.walk(t) if _is_name(n)}
            for fn in ast.walk(c.node):
                if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.args.args:
                    me = fn.args.args[0].arg
                    names |= _set_on(fn, me)
        return frozenset(names)

    def enum_members(self) -> set[str]:
        return {
            t.id
            for node in self.node.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name) and not t.id.startswith("_")
        }


@cache
def _attributes(release: Release, qualname: str) -> frozenset[str]:
    module, _, name = qualname.rpartition(".")
    return release.cls(module, name)._attributes()


def _assigns(node: ast.stmt, name: str) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in node.targets
    )


def _is_name(node: ast.AST) -> bool:
    return isinstance(node, ast.Name)


def _set_on(fn: ast.AST, me: str) -> set[str]:
    """Attributes a method sets on its first parameter (`self.x = ...`, `setattr(self, "x")`)."""
    names = set()
    for node in ast.walk(fn):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        elif isinstance(node, ast.For | ast.With):
            targets = (
                [node.target]
                if isinstance(node, ast.For)
                else [i.optional_vars for i in node.items if i.optional_vars]
            )
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("setattr", "object.__setattr__")
            and len(node.args) >= 2
            and ast.unparse(node.args[0]) == me
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(str(node.args[1].value))
        for target in targets:
            for n in ast.walk(target):
                if (
                    isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == me
                ):
                    names.add(n.attr)
    return names


def supported_versions() -> tuple[str, ...]:
    """The releases the project supports, from the one place that says so."""
    from stages.capture.releases import SUPPORTED_VERSIONS

    return SUPPORTED_VERSIONS


def require(version: str) -> Release:
    """The release, or a skip naming how to get it (an error in CI)."""
    import pytest

    reason = missing_reason(version)
    if reason:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI must read every supported SGLang release: {reason}")
        pytest.skip(reason)
    return Release(version)
