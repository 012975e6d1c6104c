import fake_core


def initialize_bf16_gemm_config():
    fake_core.record("initialize", what="bf16")
