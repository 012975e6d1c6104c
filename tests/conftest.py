"""Shared fixtures: paths to the real tiny model in ../shared and to the committed demo target."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
STORIES = SHARED / "models" / "stories260K"
DEMO_TARGET = ROOT / "data" / "demo" / "target"


@pytest.fixture(scope="session")
def stories_path() -> Path:
    assert STORIES.exists(), f"{STORIES} is missing: tests need ../shared beside the project"
    return STORIES


@pytest.fixture(scope="session")
def demo_target() -> Path:
    assert (DEMO_TARGET / "config.json").exists(), (
        f"{DEMO_TARGET} is missing: build it with `make target`"
    )
    return DEMO_TARGET
