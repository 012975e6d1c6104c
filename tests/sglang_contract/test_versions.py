"""Exactly the supported SGLang releases: the `sglang` extra admits the range and nothing around
it, and the capture engine refuses any other installed release (a post-release too), naming the
range and how to install it."""

from __future__ import annotations

import pytest
import tomllib
from packaging.requirements import Requirement

from stages.capture.releases import (
    PIP_LINE,
    SUPPORTED_RANGE,
    SUPPORTED_VERSIONS,
    SGLangVersionError,
    check_sglang_version,
)
from tests.conftest import ROOT

# releases around the supported range, as the registry lists them
NEIGHBOURS = ["0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.23.post1", "0.5.24", "0.6.0"]


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


def test_the_range_is_every_release_from_0_5_14_to_0_5_23():
    assert tuple(f"0.5.{n}" for n in range(14, 24)) == SUPPORTED_VERSIONS


@pytest.mark.parametrize("version", [*NEIGHBOURS, "0.5.14.post1", "0.5.17.post1", None])
def test_any_other_release_is_refused_naming_the_range(version, monkeypatch):
    monkeypatch.setattr("stages.capture.releases.installed_sglang_version", lambda: None)
    with pytest.raises(SGLangVersionError) as err:
        check_sglang_version(version)
    message = str(err.value)
    assert SUPPORTED_RANGE == "0.5.14 to 0.5.23" and SUPPORTED_RANGE in message
    assert PIP_LINE in message
    if version:
        assert f"{version} is installed" in message
