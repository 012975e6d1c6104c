import fake_core


def initialize_fp8_gemm_config():
    fake_core.record("initialize", what="fp8")
