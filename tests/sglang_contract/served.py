"""What a release's server accepts and answers, read from its source: launch flags, ServerArgs
fields, /generate request fields, the meta_info keys it writes, finish-reason keys, routes and
Prometheus metric names."""

from __future__ import annotations

import ast
import re
from functools import cache

from .release import Release

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w*-])")  # not "--speculative-*"


def _parse(release: Release, dotted: str) -> ast.Module:
    module = release.module(dotted)
    if module is None:
        raise LookupError(f"SGLang {release.version} has no module {dotted}")
    return module.tree


@cache
def server_args_fields(release: Release) -> frozenset[str]:
    """The fields of ServerArgs (0.5.23: assembled from the namespaces under arg_groups/fields)."""
    params = release.cls("sglang.srt.server_args", "ServerArgs").init_params() or []
    return frozenset(p.name for p in params)


@cache
def launch_flags(release: Release) -> frozenset[str]:
    """Every flag `python -m sglang.launch_server` parses: the ones `ServerArgs.add_cli_args`
    registers by hand and, where the release derives flags from annotated fields (0.5.23's
    `A[T, Arg(...)]`), `--field-name`, its `cli_name` and its `aliases`."""
    server_args = release.cls("sglang.srt.server_args", "ServerArgs")
    flags: set[str] = set()
    found = server_args.method("add_cli_args")
    assert found is not None, f"SGLang {release.version}: ServerArgs.add_cli_args is gone"
    derives = False
    for node in ast.walk(found[1]):
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func).split(".")[-1]
            if name == "add_argument":
                flags |= {
                    a.value
                    for a in node.args
                    if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                }
            derives |= name == "add_cli_args_from_dataclass"
    if derives:
        for declared in (server_args, *server_args.assembled_from()):
            for c in reversed(declared.mro()):
                for node in c.node.body:
                    flags |= _derived_flags(node)
    return frozenset(flags)


def _derived_flags(node: ast.stmt) -> set[str]:
    """The flags of one `name: A[T, Arg(...)]` / `A[T, "help"]` field (none with no_cli)."""
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
        return set()
    annotation = node.annotation
    if not (isinstance(annotation, ast.Subscript) and isinstance(annotation.slice, ast.Tuple)):
        return set()
    meta = annotation.slice.elts[1] if len(annotation.slice.elts) > 1 else None
    flags = {"--" + node.target.id.replace("_", "-")}
    if isinstance(meta, ast.Call) and ast.unparse(meta.func).endswith("Arg"):
        keywords = {k.arg: k.value for k in meta.keywords}
        if ast.unparse(keywords.get("no_cli", ast.Constant(False))) == "True":
            return set()
        if isinstance(keywords.get("cli_name"), ast.Constant):
            flags = {str(keywords["cli_name"].value)}  # type: ignore[union-attr]
        if isinstance(keywords.get("aliases"), ast.List):
            flags |= {e.value for e in keywords["aliases"].elts if isinstance(e, ast.Constant)}  # type: ignore[union-attr]
    elif not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)):
        return set()
    return flags


@cache
def generate_fields(release: Release) -> frozenset[str]:
    params = release.cls("sglang.srt.managers.io_struct", "GenerateReqInput").init_params() or []
    return frozenset(p.name for p in params)


@cache
def sampling_fields(release: Release) -> frozenset[str]:
    """What a request's sampling_params may hold: the SamplingParams constructor's parameters."""
    params = release.cls("sglang.srt.sampling.sampling_params", "SamplingParams").init_params()
    return frozenset(p.name for p in params or [])


@cache
def meta_info_keys(release: Release) -> frozenset[str]:
    """Keys the tokenizer manager writes into a reply's meta_info: the literal dict it starts
    from and every `meta_info[key] = ...` after."""
    tree = _parse(release, "sglang.srt.managers.tokenizer_manager")
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id == "meta_info"
                    and isinstance(node.value, ast.Dict)
                ):
                    keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
                if (
                    isinstance(target, ast.Subscript)
                    and ast.unparse(target.value) == "meta_info"
                    and isinstance(target.slice, ast.Constant)
                ):
                    keys.add(target.slice.value)
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "meta_info.update"
            and node.args
            and isinstance(node.args[0], ast.Dict)
        ):
            keys |= {k.value for k in node.args[0].keys if isinstance(k, ast.Constant)}
    return frozenset(keys)


@cache
def finish_reason_keys(release: Release) -> frozenset[str]:
    """Keys of the finish_reason objects in meta_info: what every `to_json` of the schedule
    batch's finish reasons returns."""
    tree = _parse(release, "sglang.srt.managers.schedule_batch")
    keys: set[str] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and "FINISH" in cls.name.upper():
            for fn in cls.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "to_json":
                    for node in ast.walk(fn):
                        if isinstance(node, ast.Dict):
                            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return frozenset(keys)


@cache
def routes(release: Release) -> frozenset[str]:
    """The HTTP server's routes: the path of every route decorator and add_api_route call, and
    the mounts (/metrics is mounted by a helper in utils/common.py)."""
    paths: set[str] = set()
    trees = [
        _parse(release, m)
        for m in ("sglang.srt.entrypoints.http_server", "sglang.srt.utils.common")
    ]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
            "get",
            "post",
            "put",
            "api_route",
            "add_api_route",
            "Mount",
        ):
            for a in node.args[:1]:
                if isinstance(a, ast.Constant) and str(a.value).startswith("/"):
                    paths.add(a.value)
    return frozenset(paths)


@cache
def server_info_keys(release: Release) -> frozenset[str]:
    """/server_info: the resolved ServerArgs, the literal keys its handler adds and the
    scheduler's start-up info it spreads in (`Scheduler.get_init_info`: max_total_num_tokens)."""
    tree = _parse(release, "sglang.srt.entrypoints.http_server")
    init_info = release.cls("sglang.srt.managers.scheduler", "Scheduler").method("get_init_info")
    assert init_info is not None, f"SGLang {release.version}: Scheduler.get_init_info is gone"
    keys: set[str] = set(server_args_fields(release)) | _dict_keys(init_info[1])
    for fn in ast.walk(tree):
        if isinstance(fn, ast.AsyncFunctionDef | ast.FunctionDef) and "server_info" in fn.name:
            keys |= _dict_keys(fn)
    return frozenset(keys)


def _dict_keys(tree: ast.AST) -> set[str]:
    """The string keys of every dict literal in `tree`."""
    return {
        k.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Dict)
        for k in node.keys
        if isinstance(k, ast.Constant)
    }


@cache
def metric_names(release: Release) -> frozenset[str]:
    """Prometheus names the release's collectors register, with their `sglang:` prefix."""
    names: set[str] = set()
    for path in (release.root / "sglang" / "srt" / "observability").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] in (
                "Gauge",
                "Counter",
                "Histogram",
                "Summary",
            ):
                for k in node.keywords:
                    if k.arg == "name":
                        names |= _prefixed(k.value)
                for a in node.args[:1]:
                    names |= _prefixed(a)
    return frozenset(names)


def _prefixed(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.JoinedStr):  # f"sglang:{name}" is left to the literal parts
        text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        return {text}
    return set()
