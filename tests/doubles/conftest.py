"""The engine tests' target, prompts and local servers, shared from tests/engines/conftest.py."""

from tests.engines.conftest import *  # noqa: F403  (fixtures, registered by import)
