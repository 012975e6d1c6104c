from fake_core import KimiK25ForConditionalGeneration  # noqa: F401
