"""The HTTP side of every supported SGLang release, read from its own source: the raw-token
client's /generate body, the meta_info and finish_reason keys the project reads, the routes it
calls, the launch flags the launcher, the served benchmark and the canary pass, the /server_info
keys the benchmark reads and the metrics the monitor reads."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from stages.capture import served as served_hidden
from stages.engines import Sampling
from stages.engines.sglang_http import SERVED_FACTS, SERVED_LIMITS, request_body
from stages.params.server import SGLangLaunchParams, SGLangServerArgs
from stages.params.target import TargetParams
from stages.serving import bench as sglang_bench
from stages.serving.launch import Speculation
from stages.wiring.engines import server_command
from tests.conftest import ROOT

from . import served
from .release import require, supported_versions

pytestmark = pytest.mark.releases

# The modules that talk to an SGLang server, and what of SGLang each one names.
ENGINES = ROOT / "stages" / "engines"
SERVING = ROOT / "stages" / "serving"
SERVED = ROOT / "stages" / "capture" / "served.py"  # the canary's reference over HTTP
CLIENT_MODULES = (
    ENGINES / "sglang_http.py",
    SERVING / "bench.py",
    SERVED,
    SERVING / "monitor.py",
)


@pytest.fixture(params=supported_versions())
def release(request):
    return require(request.param)


def string_constants(path: Path) -> list[str]:
    """Every string literal of a module, the literal parts of f-strings included."""
    return [
        n.value
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def keys_read(path: Path, holder: str) -> set[str]:
    """String keys read from a mapping whose expression ends in `holder` (`meta_info`, `meta`,
    `finish`): `x[key]`, `x.get(key)` and `key in x`."""
    keys = set()

    def holds(expr: ast.expr) -> bool:  # meta_info, reply.meta_info, (r.get('meta_info') or {})
        text = ast.unparse(expr)
        return text == holder or text.endswith(f".{holder}") or f"get('{holder}')" in text

    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Subscript) and holds(n.value) and isinstance(n.slice, ast.Constant):
            keys.add(n.slice.value)
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "get"
            and holds(n.func.value)
            and n.args
            and isinstance(n.args[0], ast.Constant)
        ):
            keys.add(n.args[0].value)
        if (
            isinstance(n, ast.Compare)
            and isinstance(n.left, ast.Constant)
            and any(isinstance(op, ast.In | ast.NotIn) for op in n.ops)
            and any(holds(c) for c in n.comparators)
        ):
            keys.add(n.left.value)
    return keys


def test_generate_body_fields(release):
    sampling = Sampling(max_new_tokens=8, temperature=0.6, top_p=0.9, top_k=20, seed=1)
    for body in (request_body("s/1", [1, 2], sampling, 0), served_hidden.request_body([1, 2])):
        unknown = set(body) - served.generate_fields(release)
        assert not unknown, f"/generate fields {unknown} are not in {release.version}'s request"
        unknown = set(body["sampling_params"]) - served.sampling_fields(release)
        assert not unknown, f"sampling_params {unknown} are not {release.version}'s"


def test_meta_info_keys_read(release):
    read = set()
    for path in CLIENT_MODULES:
        read |= keys_read(path, "meta_info") | keys_read(path, "meta")
    assert {"finish_reason", "completion_tokens", "spec_verify_ct", "hidden_states"} <= read
    unknown = read - served.meta_info_keys(release)
    assert not unknown, f"meta_info keys {unknown} are never written by SGLang {release.version}"
    finish = keys_read(ENGINES / "sglang_http.py", "finish")
    assert {"type", "matched"} <= finish
    unknown = finish - served.finish_reason_keys(release)
    assert not unknown, f"finish_reason keys {unknown} are not SGLang {release.version}'s"


@pytest.mark.slow
def test_routes_called(release):
    called = {
        s.split("?")[0]
        for path in (*CLIENT_MODULES, SERVING / "launch.py")
        for s in string_constants(path)
        if s.startswith("/") and s[1:2].isalpha() and " " not in s
    }
    assert {"/generate", "/health", "/server_info", "/model_info", "/metrics"} <= called
    older = set(sglang_bench.INFO_PATHS[1:])  # fallbacks for servers older than the supported
    missing = called - served.routes(release) - older
    assert not missing, f"SGLang {release.version} serves no {missing}"


def every_server_arg_set() -> SGLangLaunchParams:
    """Launch params with every typed server argument set to a value that emits its flag."""
    values = {
        f.name: (True if f.type in ("bool", bool) else 1)
        for f in dataclasses.fields(SGLangServerArgs)
    }
    return SGLangLaunchParams(server_args=SGLangServerArgs(**values))


# Both drafter families as the launcher and the served benchmark put them before the target.
SPECULATIONS = (Speculation.eagle3("D", 3), Speculation.dflash("D", 16))


def unknown_flags(release, command: list[str]) -> set[str]:
    """The flags of `command` that the release's launch_server does not parse."""
    return {a for a in command if a.startswith("--")} - served.launch_flags(release)


def test_launch_flags(release):
    target = TargetParams(path="/models/target", trust_remote_code=True)
    passed = [a for a in server_command(every_server_arg_set(), target) if a.startswith("--")]
    for spec in SPECULATIONS:
        passed += [a for a in spec.args() if a.startswith("--")]
    assert len(passed) >= len(dataclasses.fields(SGLangServerArgs)) + 6 + 3
    unknown = unknown_flags(release, passed)
    assert not unknown, f"launch_server {release.version} has no flag(s) {sorted(unknown)}"
    unknown = set(sglang_bench.SPECULATIVE_FIELDS) - served.server_args_fields(release)
    assert not unknown, f"ServerArgs {release.version} has no field(s) {unknown}"
    reported = {"version", *SERVED_FACTS.values(), *SERVED_LIMITS.values()}
    reported |= set(sglang_bench.SPECULATIVE_FIELDS)
    unknown = reported - served.server_info_keys(release)
    assert not unknown, f"/server_info of {release.version} reports no {unknown}"
    for spec in SPECULATIONS:  # what the served benchmark checks is what the release reports
        assert set(spec.settings()) <= set(sglang_bench.SPECULATIVE_FIELDS)


def test_each_speculative_algorithm_is_one_the_release_runs(release):
    """EAGLE3 and DFLASH are members of the release's SpeculativeAlgorithm, which
    --speculative-algorithm names (a misspelt one is refused at launch)."""
    algorithms = release.cls(
        "sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"
    ).enum_members()
    assert {spec.algorithm for spec in SPECULATIONS} <= algorithms, release.version


@pytest.mark.parametrize(
    "planted, unknown",
    [
        (
            ("--speculative-num-draft-tokens", "--speculative-block-size"),
            "--speculative-block-size",
        ),
        (
            ("--speculative-draft-model-path", "--speculative-draft-path"),
            "--speculative-draft-path",
        ),
    ],
)
def test_a_planted_wrong_dflash_flag_is_caught(release, planted, unknown):
    """The check above fails on a DFLASH launch with one flag misnamed."""
    right, wrong = planted
    command = [wrong if a == right else a for a in Speculation.dflash("D", 16).args()]
    assert unknown_flags(release, command) == {unknown}


def test_flags_named_in_messages(release):
    """Flags the launcher, the served benchmark and the server's error texts tell a user to
    pass; the canary's served reference (SGLang >= 0.5.23) is checked on its own below."""
    for path in (SERVING / "launch.py", SERVING / "bench.py", ENGINES / "sglang_http.py"):
        named = {f for s in string_constants(path) for f in served.FLAG.findall(s)}
        unknown = named - served.launch_flags(release)
        assert not unknown, f"{path.name} names {sorted(unknown)}, no flags of {release.version}"


def test_served_reference_flags(release):
    """The canary's served reference needs --enable-return-aux-hidden-states: the releases that
    have it must have every flag it names; the others must be refused by version."""
    named = set(served.FLAG.findall(served_hidden.served_flags([1, 2, 3])))
    named |= {f for s in string_constants(SERVED) for f in served.FLAG.findall(s)}
    flags = served.launch_flags(release)
    if "--enable-return-aux-hidden-states" in flags:
        assert named <= flags, f"{sorted(named - flags)} are no flags of {release.version}"
        assert served_hidden.serves_aux(release.version)
    else:
        assert not served_hidden.serves_aux(release.version)


def test_metrics_read(release):
    read = {s for s in string_constants(SERVING / "monitor.py") if s.startswith("sglang:")}
    assert read, "monitor.py reads no sglang: metric"
    unknown = read - served.metric_names(release)
    assert not unknown, f"SGLang {release.version} registers no metric {unknown}"
