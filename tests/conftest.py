"""Shared fixtures (paths to the real tiny model in ../shared and to the committed demo target) and
the gate of the tests that need ../shared.

../shared holds real public sample files (data/) and a real tiny model (models/stories260K); it
sits beside the repository in CI and in the development checkout, never in a lone clone. A test
that reads it carries the `shared` marker, naming the paths under ../shared it needs, e.g.
`@pytest.mark.shared("models/stories260K")` (no argument: ../shared itself); a test that uses the
`stories_path` fixture gets the marker by itself. When a named path is absent the test is skipped
with a reason naming it, except in CI (CI=true), where it fails: there the tests that need the
real files must run, never skip silently. A fixture that only sometimes needs ../shared calls
`require_shared` instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
STORIES_REL = "models/stories260K"
STORIES = SHARED / STORIES_REL
DEMO_TARGET = ROOT / "data" / "demo" / "target"

# fixtures that read ../shared -> the paths under it they need
SHARED_FIXTURES = {"stories_path": (STORIES_REL,)}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def missing_shared(*paths: str) -> list[Path]:
    """The paths under ../shared (../shared itself when none is named) that are absent."""
    wanted = [SHARED / p for p in paths] or [SHARED]
    return [p for p in dict.fromkeys(wanted) if not p.exists()]


def shared_reason(missing: list[Path]) -> str:
    where = ", ".join(str(p) for p in missing)
    return (
        f"needs ../shared ({where}): real public samples and a tiny model; absent in a lone clone"
    )


class SharedMissing(pytest.fail.Exception):
    """CI=true and a test's ../shared files are absent: the test fails, it does not skip."""


def fail_in_ci(missing: list[Path]) -> SharedMissing:
    return SharedMissing(
        f"{shared_reason(missing)}; CI=true, so this fails instead of skipping: "
        f"check out the shared files at {SHARED}",
        pytrace=False,
    )


def require_shared(*paths: str) -> None:
    """For a fixture that needs ../shared: skip the test using it (fail it in CI) when `paths`
    under ../shared are absent."""
    missing = missing_shared(*paths)
    if missing:
        if in_ci():
            raise fail_in_ci(missing)
        pytest.skip(shared_reason(missing))


def item_missing_shared(item: pytest.Item) -> list[Path]:
    markers = list(item.iter_markers("shared"))
    if not markers:
        return []
    return missing_shared(*(p for m in markers for p in (m.args or ("",))))


@pytest.hookimpl(tryfirst=True)  # before `-m` selects, so auto-added markers count there
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        needs = [p for name, ps in SHARED_FIXTURES.items() if name in fixtures for p in ps]
        if needs:
            item.add_marker(pytest.mark.shared(*needs))
        missing = item_missing_shared(item)
        if missing and not in_ci():  # a skip marker: -rs lists each test at its definition
            item.add_marker(pytest.mark.skip(reason=shared_reason(missing)))


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    missing = item_missing_shared(item)
    if missing and in_ci():
        raise fail_in_ci(missing)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if call.excinfo is not None and call.excinfo.errisinstance(SharedMissing):
        report.shared_missing = True
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport):
    """A test failed for its absent ../shared files counts as FAILED, not as a setup ERROR."""
    if getattr(report, "shared_missing", False) and report.failed:
        return "failed", "F", "FAILED"
    return None


@pytest.fixture(scope="session")
def stories_path() -> Path:
    require_shared(STORIES_REL)
    return STORIES


@pytest.fixture(scope="session")
def demo_target() -> Path:
    assert (DEMO_TARGET / "config.json").exists(), (
        f"{DEMO_TARGET} is missing: build it with `make target`"
    )
    return DEMO_TARGET


@pytest.fixture
def compile_without_codegen(monkeypatch):
    """torch.compile through dynamo and AOTAutograd (graph breaks, guards, dynamic shapes, the
    decomposed forward and backward graphs and their numerics) to AOTAutograd's eager backend
    instead of inductor. On a GPU inductor writes Triton kernels, which this CPU cannot run; its
    C++ kernels for the CPU take minutes to build on a cold cache and are never used in training
    (the CPU trains eager)."""
    import torch

    compile_ = torch.compile

    def without_codegen(*args, **kwargs):
        return compile_(*args, **{**kwargs, "backend": "aot_eager"})

    monkeypatch.setattr(torch, "compile", without_codegen)
