"""The SGLang releases the in-process capture engine supports, and the check that refuses others.

Everything around SGLang's capture seam (how a ModelRunner is built, how parallel state is set
up, how a prefill batch becomes a ForwardBatch) changes between releases, so the engine has one
adapter per release, each checked in CI against that release's own source
(tests/sglang_contract), and nothing is guessed for a release that is not checked. No SGLang or
torch import here: `make sglang-releases` and the tests read this list without them.
"""

from __future__ import annotations

import importlib.metadata

from ..engines import EngineError

SUPPORTED_VERSIONS = ("0.5.14", "0.5.23")
PIP_LINES = tuple(f'pip install "sglang=={v}"' for v in SUPPORTED_VERSIONS)


class SGLangVersionError(EngineError):
    """SGLang is missing, or of a release the capture engine is not written against."""


def installed_sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_sglang_version(version: str | None = None) -> str:
    """The supported release installed (or `version`), exactly (a post-release is another
    release); else an error naming both releases and their pip lines."""
    version = installed_sglang_version() if version is None else version
    choices = " or ".join(f"{v} ({line})" for v, line in zip(SUPPORTED_VERSIONS, PIP_LINES))
    if version is None:
        raise SGLangVersionError(
            f"extract.engine sglang needs SGLang installed, one of the releases it is checked "
            f"against: {choices}"
        )
    if version.split("+")[0] in SUPPORTED_VERSIONS:  # a local build tag (+cu128) is the same
        return version.split("+")[0]
    raise SGLangVersionError(
        f"extract.engine sglang supports SGLang {' and '.join(SUPPORTED_VERSIONS)} only; "
        f"{version} is installed, and the model-runner API around the capture changes at "
        f"every release. Install one of them: {choices}"
    )
