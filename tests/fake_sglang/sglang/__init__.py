"""Stand-in for SGLang (tests/fake_sglang): see tests/fake_sglang/__init__.py."""

import importlib.metadata


def __getattr__(name: str):
    if name == "__version__":
        return importlib.metadata.version("sglang")
    raise AttributeError(name)
