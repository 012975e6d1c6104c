from fake_core import SamplingParams  # noqa: F401
