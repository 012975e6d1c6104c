"""Every SGLang name a class of the project uses, checked against one release's source.

A small type walk over the class's methods: names imported from SGLang are followed to their
definitions; calls are checked against the callee's parameters (keywords known, required ones
given, not too many positional); values made by SGLang constructors, by methods with a return
annotation, or read from annotated fields carry their class, so every attribute read or written
on them, and every enum member, is checked against what the real class defines or sets. What
cannot be typed is reported as unchecked, never passed silently.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from dataclasses import dataclass, field

from .release import Class, Release, Symbol, call_problems, function_params

# The model object a ModelRunner loads is the target's own class: these are the families the
# engine serves, so whatever the engine reads from `runner.model` must exist on each.
MODEL_CLASSES = (
    ("sglang.srt.models.llama", "LlamaForCausalLM"),
    ("sglang.srt.models.deepseek_v2", "DeepseekV2ForCausalLM"),
    ("sglang.srt.models.deepseek_v2", "DeepseekV3ForCausalLM"),
    ("sglang.srt.models.kimi_k25", "KimiK25ForConditionalGeneration"),
)


def external_base_with(c: Class, name: str) -> str | None:
    """The base from outside the release (torch.nn.Module, ...) that has `name`, imported here
    to ask it; None if none has."""
    for base in c.external_bases():
        module, _, attr = base.rpartition(".")
        try:
            if hasattr(getattr(importlib.import_module(module), attr), name):
                return base
        except (ImportError, AttributeError):
            continue
    return None


@dataclass
class Typed:
    """What an expression is: SGLang classes (a union: all must have what is read), a module,
    a function, a bound method, or nothing known."""

    classes: tuple[Class, ...] = ()
    instance: bool = True
    module: str | None = None
    function: Symbol | None = None
    methods: tuple[tuple[Class, str], ...] = ()  # bound methods (one per class of a union)
    from_sglang: bool = False  # made by SGLang, though of no known class
    outside: str | None = None  # an object of a class from outside SGLang (torch.Tensor, ...)

    @property
    def known(self) -> bool:
        return bool(self.classes or self.module or self.function or self.methods or self.outside)


UNKNOWN = Typed()


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # what was checked, for the test to show
    unchecked: list[str] = field(default_factory=list)


def union(results: list[Typed]) -> Typed:
    """What a value is when it is any of `results` (the branches or the classes it came by)."""
    if len(results) == 1 or (results and all(r == UNKNOWN for r in results)):
        return results[0]
    if results and all(r.outside is not None for r in results):
        return results[0]
    if results and all(r.methods for r in results):
        return Typed(methods=tuple(m for r in results for m in r.methods))
    if results and all(r.classes and r.instance for r in results):
        return Typed(tuple({c.symbol.qualname: c for r in results for c in r.classes}.values()))
    return Typed(from_sglang=True) if results else UNKNOWN


class ClassWalk:
    """Walk the methods of one class of the project against `release`."""

    def __init__(self, release: Release, cls: type | str):
        """`cls`: the class (with its bases from the same module), or their source text."""
        self.release = release
        if isinstance(cls, str):
            self.source = cls
        else:
            own = [k for k in reversed(cls.__mro__) if k.__module__ == cls.__module__]
            self.source = "\n".join(textwrap.dedent(inspect.getsource(k)) for k in own)
        self.tree = ast.parse(self.source)
        assert all(isinstance(n, ast.ClassDef) for n in self.tree.body)
        self.self_attrs: dict[str, Typed] = {}
        self.own_returns: dict[str, Typed] = {}  # what each walked method returns
        self.own_args: dict[tuple[str, str], Typed] = {}  # (method, parameter): what it is given
        self._types: dict[tuple[str, str], Typed] = {}
        self.report = Report()

    def run(self) -> Report:
        methods = [
            n
            for c in self.tree.body
            for n in c.body
            if isinstance(n, ast.FunctionDef)  # type: ignore[attr-defined]
        ]
        self.own_methods = {m.name for m in methods}
        self.own_defs = methods
        # the definition of a name that the adapter runs: the last one, its class first in the
        # MRO (the walked source goes from the bases to the class)
        self.running = {m.name: m for m in methods}
        for final in (False, True):  # the first pass learns self's attributes
            self.report = Report()
            for fn in methods:
                self.walk_function(fn, record=final)
        return self.report

    # --- names ----------------------------------------------------------------------------

    def walk_function(self, fn: ast.FunctionDef, record: bool) -> None:
        self.record = record
        self.function = fn.name
        self.walking = fn
        self.env: dict[str, Typed] = {
            a.arg: self.own_args[(fn.name, a.arg)]
            for a in fn.args.args + fn.args.kwonlyargs
            if (fn.name, a.arg) in self.own_args
        }
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
                for alias in node.names:
                    where = f"{node.module}.{alias.name}"
                    symbol = self.release.lookup(node.module, alias.name)
                    if symbol is None:
                        self.problem(node, f"`from {node.module} import {alias.name}`: no {where}")
                        continue
                    self.note(f"import {where}")
                    self.env[alias.asname or alias.name] = self.of_symbol(symbol, instance=False)
        for stmt in fn.body:
            self.statement(stmt)

    def of_symbol(self, symbol: Symbol, instance: bool) -> Typed:
        if symbol.kind == "class":
            return Typed((Class(symbol),), instance=instance)
        if symbol.kind == "module":
            return Typed(module=symbol.qualname)
        if symbol.kind == "function":
            return Typed(function=symbol)
        return Typed(from_sglang=True)

    def problem(self, node: ast.AST, text: str) -> None:
        if self.record:
            self.report.problems.append(f"line {getattr(node, 'lineno', '?')}: {text}")

    def note(self, text: str) -> None:
        if self.record:
            self.report.checked.append(text)

    def unchecked(self, node: ast.AST, text: str) -> None:
        if self.record:
            self.report.unchecked.append(f"line {getattr(node, 'lineno', '?')}: {text}")

    # --- statements -----------------------------------------------------------------------

    def statement(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            value = self.expr(stmt.value)
            for target in stmt.targets:
                self.bind(target, stmt.value, value)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.bind(stmt.target, stmt.value, self.expr(stmt.value))
        elif isinstance(stmt, ast.Return) and stmt.value is not None:
            returned = self.expr(stmt.value)
            # a request built by one method is checked where another uses it; an overridden
            # definition's return is not what the adapter's calls get
            if returned.known and self.running[self.function] is self.walking:
                self.own_returns[self.function] = returned
        elif isinstance(stmt, ast.Expr) and stmt.value is not None:
            self.expr(stmt.value)
        elif isinstance(stmt, ast.For):
            self.expr(stmt.iter)
            for s in stmt.body + stmt.orelse:
                self.statement(s)
        elif isinstance(stmt, ast.Try):
            for s in stmt.body + stmt.orelse + stmt.finalbody:
                self.statement(s)
        elif isinstance(stmt, ast.If | ast.While):
            self.expr(stmt.test)
            for s in stmt.body + stmt.orelse:
                self.statement(s)
        elif isinstance(stmt, ast.With):
            for item in stmt.items:
                self.expr(item.context_expr)
            for s in stmt.body:
                self.statement(s)

    def bind(self, target: ast.expr, value_node: ast.expr, value: Typed) -> None:
        if isinstance(target, ast.Tuple) and isinstance(value_node, ast.Tuple):
            for t, v in zip(target.elts, value_node.elts):
                self.bind(t, v, self.expr(v))
        elif isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, ast.Attribute):
            if ast.unparse(target.value) == "self":
                self.self_attrs[target.attr] = value
            else:
                self.attribute(target, self.expr(target.value), target.attr, store=True)

    # --- expressions ----------------------------------------------------------------------

    def expr(self, node: ast.expr) -> Typed:
        if isinstance(node, ast.Name):
            return self.env.get(node.id, UNKNOWN)
        if isinstance(node, ast.Attribute):
            if ast.unparse(node.value) == "self":
                if node.attr not in self.self_attrs and node.attr not in self.own_methods:
                    self.unchecked(node, f"self.{node.attr} is never set in the walked methods")
                return self.self_attrs.get(node.attr, UNKNOWN)
            return self.attribute(node, self.expr(node.value), node.attr, store=False)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.IfExp):
            return self.if_expression(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
        return UNKNOWN

    def if_expression(self, node: ast.IfExp) -> Typed:
        """`a if hasattr(x, "name") else b`: in `a`, x is the classes of its union that have
        `name`; in `b`, those that lack it (a branch no class takes is not walked)."""
        self.expr(node.test)
        test = node.test
        if not (
            isinstance(test, ast.Call)
            and ast.unparse(test.func) == "hasattr"
            and len(test.args) == 2
            and isinstance(test.args[0], ast.Name)
            and isinstance(test.args[1], ast.Constant)
            and self.env.get(test.args[0].id, UNKNOWN).classes
        ):
            return union([self.expr(node.body), self.expr(node.orelse)])
        var, name = test.args[0].id, str(test.args[1].value)
        typed = self.env[var]
        having = tuple(c for c in typed.classes if self.has(c, name))
        lacking = tuple(c for c in typed.classes if c not in having)
        results = []
        for branch, classes in ((node.body, having), (node.orelse, lacking)):
            if classes:
                self.env[var] = Typed(classes)
                results.append(self.expr(branch))
        self.env[var] = typed
        return union(results)

    @staticmethod
    def has(c: Class, name: str) -> bool:
        return name in c.attributes() or external_base_with(c, name) is not None

    def attribute(self, node: ast.AST, owner: Typed, name: str, store: bool) -> Typed:
        if owner.module:
            symbol = self.release.lookup(owner.module, name)
            if symbol is None:
                self.problem(node, f"module {owner.module} has no {name}")
                return UNKNOWN
            self.note(f"{owner.module}.{name}")
            return self.of_symbol(symbol, instance=False)
        if owner.outside:
            module, _, attr = owner.outside.rpartition(".")
            if module and not hasattr(getattr(importlib.import_module(module), attr), name):
                self.problem(node, f"{owner.outside} has no .{name}")
            return Typed(outside="")  # what it returns is not typed further
        if not owner.classes:
            if owner.from_sglang:
                self.unchecked(node, f".{name} of a value SGLang made, of no known class")
            return UNKNOWN
        results = []
        for c in owner.classes:
            if c.is_enum and not owner.instance:
                if name not in c.enum_members():
                    self.problem(node, f"enum {c.name} has no member {name}")
                    continue
                self.note(f"{c.name}.{name} (enum member)")
                results.append(Typed((c,)))
                continue
            if name not in c.attributes():
                base = external_base_with(c, name)
                if base is None:
                    self.problem(node, f"{c.name} neither defines nor sets .{name}")
                    continue
                self.note(f"{c.name}.{name} (from {base})")
                results.append(Typed(outside=""))
                continue
            self.note(f"{c.name}.{name}{' (set)' if store else ''}")
            if c.method(name) is not None and not self.is_property(c, name):
                results.append(Typed(methods=((c, name),)))
            else:
                results.append(self.attribute_type(c, name))
        return union(results)

    @staticmethod
    def is_property(c: Class, name: str) -> bool:
        found = c.method(name)
        return found is not None and any(
            ast.unparse(d) in ("property", "cached_property", "functools.cached_property")
            for d in found[1].decorator_list
        )

    def attribute_type(self, c: Class, name: str) -> Typed:
        key = (c.symbol.qualname, name)
        if key not in self._types:
            self._types[key] = self._attribute_type(c, name)
        return self._types[key]

    def _attribute_type(self, c: Class, name: str) -> Typed:
        """The class of an attribute, from an annotation in the class body or on `self.name`,
        or (property) its return annotation; `model` of a ModelRunner is the served models."""
        if name == "model" and c.name == "ModelRunner":
            return Typed(tuple(self.release.cls(m, n) for m, n in MODEL_CLASSES))
        for k in c.mro():
            for node in ast.walk(k.node):
                annotation = None
                if isinstance(node, ast.AnnAssign):
                    target = ast.unparse(node.target)
                    if target in (name, f"self.{name}"):
                        annotation = node.annotation
                if isinstance(node, ast.FunctionDef) and node.name == name and node.returns:
                    annotation = node.returns
                if annotation is not None:
                    typed = self.annotation(k, annotation)
                    if typed.known:
                        return typed
        made = self.constructed(c, name)
        return Typed(made) if made else Typed(from_sglang=True)

    def constructed(self, c: Class, name: str) -> tuple[Class, ...]:
        """The release classes whose constructors `self.name = X(...)` assigns, in any method of
        the class or its bases (a union: whichever is built, what is read must exist on it)."""
        made: dict[str, Class] = {}
        for k in c.mro():
            for fn in ast.walk(k.node):
                if not isinstance(fn, ast.FunctionDef):
                    continue
                params = {a.arg: a.annotation for a in fn.args.args + fn.args.kwonlyargs}
                for node in ast.walk(fn):
                    if not (
                        isinstance(node, ast.Assign)
                        and any(ast.unparse(t) == f"self.{name}" for t in node.targets)
                    ):
                        continue
                    value = node.value
                    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                        symbol = self.release.lookup(k.symbol.module, value.func.id)
                        if symbol is not None and symbol.kind == "class":
                            made[symbol.qualname] = Class(symbol)
                    elif isinstance(value, ast.Name) and params.get(value.id) is not None:
                        typed = self.annotation(k, params[value.id])  # self.x = x: X
                        made |= {t.symbol.qualname: t for t in typed.classes}
        return tuple(made.values())

    def annotation(self, c: Class, node: ast.expr) -> Typed:
        """The first release class an annotation names (X, Optional[X], Union[X, ...], "X")."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return UNKNOWN
        names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
        for name in names:
            if name in ("cls", "Self") or name == c.name:
                return Typed((c,))
            symbol = self.release.lookup(c.symbol.module, name)
            if symbol is not None and symbol.kind == "class":
                return Typed((Class(symbol),))
        if "torch.Tensor" in {ast.unparse(n) for n in ast.walk(node)} or "Tensor" in names:
            return Typed(outside="torch.Tensor")
        return UNKNOWN

    def call(self, node: ast.Call) -> Typed:
        if (
            isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "self"
            and node.func.attr in self.own_methods
        ):
            self.own_call(node, node.func.attr)
            return self.own_returns.get(node.func.attr, UNKNOWN)
        callee = self.expr(node.func)
        for a in node.args:
            self.expr(a)
        for k in node.keywords:
            self.expr(k.value)
        positional = len([a for a in node.args if not isinstance(a, ast.Starred)])
        keywords = [k.arg for k in node.keywords if k.arg]
        star = any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        )
        text = ast.unparse(node.func)
        if callee.classes and not callee.instance:
            (c,) = callee.classes
            params = c.init_params()
            if params is None:
                self.unchecked(node, f"{text}(...): {c.name}'s constructor is not in the release")
            else:
                self.check(node, f"{c.name}(...)", params, positional, keywords, star)
            return Typed((c,))
        if callee.methods:
            returned = []
            for c, name in callee.methods:
                found = c.method(name)
                assert found is not None
                owner, fn = found
                decorators = {ast.unparse(d) for d in fn.decorator_list}
                params = function_params(fn, bound="staticmethod" not in decorators)
                self.check(node, f"{c.name}.{name}(...)", params, positional, keywords, star)
                returned.append(self.returns(owner, fn, decorators))
            return returned[0] if len(returned) == 1 else Typed(from_sglang=True)
        if callee.function is not None:
            fn = callee.function.node
            assert isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            params = function_params(fn, bound=False)
            self.check(node, f"{callee.function.qualname}(...)", params, positional, keywords, star)
            bag = self.config_bag(fn)
            if bag is not None:
                return bag
            if callee.function.qualname.endswith(".resolving_view") and node.args:
                # 0.5.19 on: a live read view of the ServerArgs given, whose `__getattr__` reads
                # the resolution's declarations, then the fields: what it reads is a field
                return self.expr(node.args[0])
            if fn.returns is not None:
                for name in (n.id for n in ast.walk(fn.returns) if isinstance(n, ast.Name)):
                    symbol = self.release.lookup(callee.function.module, name)
                    if symbol is not None and symbol.kind == "class":
                        return Typed((Class(symbol),))
            return Typed(from_sglang=True)
        if callee.outside is not None:
            return Typed(outside="")  # torch's API, not SGLang's
        if callee.from_sglang:
            self.unchecked(node, f"{text}(...) on a value SGLang made, of no known class")
        return UNKNOWN

    def own_call(self, node: ast.Call, name: str) -> None:
        """A call of a walked method: what its arguments are is what its parameters are when it
        is walked (a request built in one method, extended in another, is checked in both)."""
        for fn in (d for d in self.own_defs if d.name == name):
            params = [a.arg for a in fn.args.args[1:]]
            given = [*zip(params, node.args), *((k.arg, k.value) for k in node.keywords)]
            for param, value in given:
                typed = self.expr(value)
                if param and typed.known:
                    self.own_args[(name, param)] = typed

    def config_bag(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Typed | None:
        """0.5.20 on, `get_<ns>()` returns `config_bag("<ns>")`: the resolved fields of the
        ServerArgs namespace whose `_NS_PATH` is <ns>."""
        body = [s for s in fn.body if not isinstance(s, ast.Expr)]
        if not (len(body) == 1 and isinstance(body[0], ast.Return)):
            return None
        value = body[0].value
        if not (
            isinstance(value, ast.Call)
            and ast.unparse(value.func).endswith(".config_bag")
            and value.args
            and isinstance(value.args[0], ast.Constant)
        ):
            return None
        server_args = self.release.cls("sglang.srt.server_args", "ServerArgs")
        for namespace in server_args.assembled_from():
            for node in namespace.node.body:
                if (
                    isinstance(node, ast.Assign)
                    and ast.unparse(node.targets[0]) == "_NS_PATH"
                    and isinstance(node.value, ast.Constant)
                    and node.value.value == value.args[0].value
                ):
                    return Typed((namespace,))
        if not server_args.assembled_from():
            # 0.5.19's ServerArgs is one dataclass whose fields name their namespace
            # (`NS("schedule")`): a bag holds those of its fields, checked as ServerArgs'
            return Typed((server_args,))
        return None

    def returns(self, owner: Class, fn: ast.FunctionDef, decorators: set[str]) -> Typed:
        """What a method returns: its annotation, or for a classmethod that builds `cls(...)`
        (ScheduleBatch.init_new) the class."""
        if fn.returns is not None:
            return self.annotation(owner, fn.returns)
        if "classmethod" in decorators and any(
            isinstance(n, ast.Call) and ast.unparse(n.func) == "cls" for n in ast.walk(fn)
        ):
            return Typed((owner,))
        return Typed(from_sglang=True)

    def check(self, node, what, params, positional, keywords, star) -> None:
        problems = call_problems(params, positional, keywords, star)
        for p in problems:
            self.problem(node, f"{what}: {p}")
        if not problems:
            self.note(f"{what} with {sorted(keywords)}")
