from fake_core import LlamaForCausalLM  # noqa: F401
