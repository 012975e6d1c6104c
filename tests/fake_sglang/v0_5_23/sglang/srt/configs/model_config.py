from fake_core import ModelConfig  # noqa: F401
