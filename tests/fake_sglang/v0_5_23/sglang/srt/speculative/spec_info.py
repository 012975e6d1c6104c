from fake_core import SpeculativeAlgorithm  # noqa: F401
