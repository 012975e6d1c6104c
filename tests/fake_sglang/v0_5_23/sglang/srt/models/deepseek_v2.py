from fake_core import DeepseekV2ForCausalLM  # noqa: F401
