"""The SGLang releases the in-process capture engine supports, and the check that refuses others.

Everything around SGLang's capture seam (how a ModelRunner is built, how parallel state is set
up, how a prefill batch becomes a ForwardBatch) changes between releases, so the engine has one
adapter per release (capture/runners.py), each checked in CI against that release's own source
(tests/sglang_contract), and nothing is guessed for a release that is not checked. No SGLang or
torch import here: `make sglang-releases` and the tests read this list without them.
"""

from __future__ import annotations

import importlib.metadata

from ..engines import EngineError

SUPPORTED_VERSIONS = tuple(f"0.5.{minor}" for minor in range(14, 24))  # 0.5.14 to 0.5.23
PIP_LINE = f'pip install "sglang=={SUPPORTED_VERSIONS[-1]}"'
SUPPORTED_RANGE = f"{SUPPORTED_VERSIONS[0]} to {SUPPORTED_VERSIONS[-1]}"


class SGLangVersionError(EngineError):
    """SGLang is missing, or of a release the capture engine is not written against."""


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str:
    """The supported release installed (or `version`), exactly (a post-release is another
    release); else an error naming the range and how to install the newest of it."""
    version = installed_sglang_version() if version is None else version
    choices = f"{SUPPORTED_RANGE} ({PIP_LINE}, or the release your servers run)"
    if version is None:
        raise SGLangVersionError(
            f"extract.engine sglang needs SGLang installed, one of the releases it is checked "
            f"against: {choices}"
        )
    if version.split("+")[0] in SUPPORTED_VERSIONS:  # a local build tag (+cu128) is the same
        return version.split("+")[0]
    raise SGLangVersionError(
        f"extract.engine sglang supports SGLang {SUPPORTED_RANGE} only; "
        f"{version} is installed, and the model-runner API around the capture changes at "
        f"every release. Install one of them: {choices}"
    )
