"""The SGLang stand-in of a release (tests/fake_sglang/v<version>/sglang) held to that release.

Read both with the same reader (release.py), so a stand-in can never accept a call, hand out an
attribute or name a module that the release does not:
- every module of the stand-in is a module of the release, every public name it defines is
  defined (or re-exported) there;
- every public function and method takes parameters the real one takes, in the same positions,
  each required exactly where the real one requires it, no `*args` / `**kwargs` the real one
  lacks, and every parameter the real one requires;
- every public attribute a stand-in class defines or sets is defined or set by the real class;
- every enum member is a member of the real enum.
Names starting with "_" are the stand-in's own machinery and not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

from .release import Class, Param, Release, function_params


def param_problems(fake: list[Param], real: list[Param]) -> list[str]:
    problems = []
    real_by_name = {p.name: p for p in real}
    fake_positional = [p for p in fake if p.kind in ("positional_only", "positional")]
    real_positional = [p for p in real if p.kind in ("positional_only", "positional")]
    for i, p in enumerate(fake_positional):
        if i >= len(real_positional) or real_positional[i].name != p.name:
            where = real_positional[i].name if i < len(real_positional) else "nothing"
            problems.append(f"positional parameter {i} is {p.name!r}, the release's is {where}")
    for p in fake:
        if p.kind in ("var_positional", "var_keyword"):
            if not any(r.kind == p.kind for r in real):
                problems.append(f"takes {p}, the release's does not")
            continue
        r = real_by_name.get(p.name)
        if r is None or r.kind in ("var_positional", "var_keyword"):
            problems.append(f"parameter {p.name!r} is not the release's")
        elif p.required != r.required:
            problems.append(
                f"parameter {p.name!r} is {'required' if p.required else 'optional'}, the "
                f"release's is {'required' if r.required else 'optional'}"
            )
    fake_names = {p.name for p in fake}
    for r in real:
        if r.required and r.name not in fake_names:
            problems.append(f"lacks the release's required parameter {r.name!r}")
    return problems


def stand_in_problems(release: Release, stand_in_root: Path, core: Path) -> list[str]:
    """Every way the stand-in under `stand_in_root` (holding `sglang/`, and importing what the
    releases' stand-ins share from `core`, the module `fake_core`) differs from `release`."""
    fake = Release(release.version, stand_in_root, {"fake_core": core})
    problems: list[str] = []
    for path in sorted((stand_in_root / "sglang").rglob("*.py")):
        parts = path.relative_to(stand_in_root).with_suffix("").parts
        dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if any(p.startswith("_") and p != "__init__" for p in parts):
            continue
        if release.module(dotted) is None:
            problems.append(f"{dotted}: no such module in SGLang {release.version}")
            continue
        module = fake.module(dotted)
        assert module is not None
        for name in sorted(module.names):
            bound = module.names[name]
            if isinstance(bound, ast.ImportFrom) and bound.module != "fake_core":
                continue  # checked where it is defined
            symbol = fake.lookup(dotted, name)
            if name.startswith("_") or symbol is None or symbol.kind not in ("class", "function"):
                continue  # its own machinery, plain values and imports from outside
            node = symbol.node
            assert isinstance(node, ast.ClassDef | ast.FunctionDef)
            where = f"{dotted}.{name}"
            real = release.lookup(dotted, name)
            if real is None:
                problems.append(f"{where}: SGLang {release.version} defines no such name")
            elif isinstance(node, ast.FunctionDef):
                if real.kind != "function":
                    problems.append(f"{where}: a function here, a {real.kind} in the release")
                    continue
                assert isinstance(real.node, ast.FunctionDef | ast.AsyncFunctionDef)
                for p in param_problems(
                    function_params(node, bound=False), function_params(real.node, bound=False)
                ):
                    problems.append(f"{where}(): {p}")
            elif real.kind != "class":
                problems.append(f"{where}: a class here, a {real.kind} in the release")
            else:
                problems += class_problems(Class(symbol), Class(real), where)
    return problems


def class_problems(fake: Class, real: Class, where: str) -> list[str]:
    problems = []
    if fake.is_enum:
        missing = fake.enum_members() - real.enum_members()
        if missing:
            problems.append(f"{where}: enum members {sorted(missing)} are not the release's")
        return problems
    methods = {
        n.name
        for k in fake.mro()
        for n in k.node.body
        if isinstance(n, ast.FunctionDef) and (not n.name.startswith("_") or n.name == "__init__")
    }
    if fake.is_dataclass or fake.is_struct:
        methods.add("__init__")
    for name in sorted(methods):
        fake_params = fake.method_params(name)
        real_params = real.method_params(name)
        if real_params is None:
            problems.append(f"{where}.{name}: the release's class has no such method")
            continue
        assert fake_params is not None
        for p in param_problems(fake_params, real_params):
            problems.append(f"{where}.{name}(): {p}")
    real_attributes = real.attributes()
    own = {a for a in fake.attributes() if not a.startswith("_")}
    for name in sorted(own - real_attributes):
        if not _from_outside(real, name):
            problems.append(f"{where}.{name}: the release's class neither defines nor sets it")
    return problems


def _from_outside(real: Class, name: str) -> bool:
    """Whether a base from outside the release (torch.nn.Module, ...) provides `name`."""
    from .calls import external_base_with

    return external_base_with(real, name) is not None
