"""The methods a release calls on the tree cache while it prepares a prefill batch.

The capture engine hands `ScheduleBatch.init_new` its own tree cache (stages/capture/runners.py
`PrefillOnlyCache`), so every method the release calls on it from `prepare_for_extend` on,
through the allocation functions, the allocator's methods and the out-of-memory path's message,
must exist there. A small call-graph walk over the release's source: from `prepare_for_extend`,
calls of `self.<method>` follow the class's methods, calls of a plain name follow the function it
names in its module, calls on an allocator follow the plain KV allocators' methods, and a call
`<...>tree_cache.<method>(...)` is recorded. A branch whose test is one of the cache's constant
answers (`supports_swa()`, `supports_mamba()`, ...) is walked only on the side the cache's answer
takes. Branches on the requests' data are all walked, so the list is a superset of what a
prefill-only batch reaches.
"""

from __future__ import annotations

import ast

from .release import Class, Release

# The plain KV allocators (no sliding window, no hybrid pools): the class a non-SWA target's
# runner builds, its paged form and their base, wherever the release defines them.
ALLOCATORS = ("BaseTokenToKVPoolAllocator", "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator")
ALLOCATOR_MODULES = ("sglang.srt.mem_cache.allocator", "sglang.srt.mem_cache.allocator.base")
Function = ast.FunctionDef | ast.AsyncFunctionDef


def constant_answer(test: ast.expr, answers: dict[str, bool]) -> bool | None:
    """The value of `[not] <...>tree_cache.<m>()` when the cache answers `m` with a constant."""
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    call = test.operand if isinstance(test, ast.UnaryOp) and negated else test
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in answers
        and ast.unparse(call.func.value).endswith("tree_cache")
    ):
        return answers[call.func.attr] != negated
    return None


class TreeCacheCalls:
    """Walk one release from `ScheduleBatch.prepare_for_extend`; `calls` maps each tree-cache
    method called to the chain of functions that reaches it."""

    def __init__(self, release: Release, answers: dict[str, bool]):
        self.release = release
        self.answers = answers
        self.seen: set[tuple[str, str]] = set()
        self.calls: dict[str, list[str]] = {}
        self.allocators = [
            Class(symbol)
            for module in ALLOCATOR_MODULES
            for name in ALLOCATORS
            if (symbol := release.lookup(module, name)) is not None and symbol.kind == "class"
        ]

    def run(self) -> dict[str, list[str]]:
        batch = self.release.cls("sglang.srt.managers.schedule_batch", "ScheduleBatch")
        found = batch.method("prepare_for_extend")
        assert found is not None, f"SGLang {self.release.version}: no prepare_for_extend"
        self.function(found[1], found[0].symbol.module, found[0], [])
        return self.calls

    def function(self, fn: Function, module: str, owner: Class | None, trail: list[str]) -> None:
        key = (module, f"{owner.name if owner else ''}.{fn.name}")
        if key in self.seen:
            return
        self.seen.add(key)
        for stmt in fn.body:
            self.visit(stmt, module, owner, [*trail, fn.name])

    def visit(self, node: ast.AST, module: str, owner: Class | None, trail: list[str]) -> None:
        if isinstance(node, ast.If | ast.IfExp):
            answer = constant_answer(node.test, self.answers)
            if answer is not None:
                taken = node.body if answer else node.orelse
                for child in taken if isinstance(taken, list) else [taken]:
                    self.visit(child, module, owner, trail)
                return
        if isinstance(node, ast.Call):
            self.call(node, module, owner, trail)
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                self.visit(child, module, owner, trail)

    def call(self, node: ast.Call, module: str, owner: Class | None, trail: list[str]) -> None:
        func = node.func
        if isinstance(func, ast.Name):
            symbol = self.release.lookup(module, func.id)
            if symbol is not None and symbol.kind == "function":
                assert isinstance(symbol.node, Function)
                self.function(symbol.node, symbol.module, None, trail)
            return
        if not isinstance(func, ast.Attribute):
            return
        on = ast.unparse(func.value)
        if on.endswith("tree_cache"):
            self.calls.setdefault(func.attr, trail)
            return
        classes = [owner] if on == "self" and owner is not None else []
        if on.endswith("allocator"):
            classes = self.allocators
        for c in classes:
            found = c.method(func.attr)
            if found is not None:
                self.function(found[1], found[0].symbol.module, found[0], trail)


def cache_answers(cache: type) -> dict[str, bool]:
    """The cache's constant answers: its `supports_*` / `is_*` methods, called."""
    instance = cache.__new__(cache)
    return {
        name: bool(getattr(instance, name)())
        for name in dir(cache)
        if name.startswith(("supports_", "is_")) and callable(getattr(cache, name))
    }


def missing_methods(release: Release, cache: type) -> dict[str, list[str]]:
    """The tree-cache methods the release's prefill path calls that `cache` lacks, each with
    the chain of functions that calls it."""
    calls = TreeCacheCalls(release, cache_answers(cache)).run()
    return {name: trail for name, trail in calls.items() if not hasattr(cache, name)}
