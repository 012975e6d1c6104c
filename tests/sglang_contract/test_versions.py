"""Exactly the supported SGLang releases: the `sglang` extra admits them and no other, and the
capture engine refuses any other installed release, naming both and their pip lines."""

from __future__ import annotations

import pytest
import tomllib
from packaging.requirements import Requirement

from stages.capture.releases import (
    PIP_LINES,
    SUPPORTED_VERSIONS,
    SGLangVersionError,
    check_sglang_version,
)
from tests.conftest import ROOT

# releases around the supported ones, as the registry lists them (0.5.13 .. 0.5.23 and after)
NEIGHBOURS = [
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    *[f"0.5.{n}" for n in range(15, 23)],
    "0.5.15.post1",
    "0.5.23.post1",
    "0.5.24",
    "0.6.0",
]


def test_the_extra_admits_exactly_the_supported_releases():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (line,) = project["optional-dependencies"]["sglang"]
    requirement = Requirement(line)
    assert requirement.name == "sglang"
    assert all(requirement.specifier.contains(v) for v in SUPPORTED_VERSIONS)
    admitted = [v for v in NEIGHBOURS if requirement.specifier.contains(v)]
    assert not admitted, f"the sglang extra admits {admitted}"


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_a_supported_release_passes(version):
    assert check_sglang_version(version) == version
    assert check_sglang_version(f"{version}+cu128") == version  # a local build of it


@pytest.mark.parametrize("version", [*NEIGHBOURS, "0.5.14.post1", None])
def test_any_other_release_is_refused_naming_both(version, monkeypatch):
    monkeypatch.setattr("stages.capture.releases.installed_sglang_version", lambda: None)
    with pytest.raises(SGLangVersionError) as err:
        check_sglang_version(version)
    message = str(err.value)
    assert all(v in message for v in SUPPORTED_VERSIONS)
    assert all(line in message for line in PIP_LINES)
    if version:
        assert f"{version} is installed" in message
