import fake_core


def initialize_fp4_gemm_config():
    fake_core.record("initialize", what="fp4")
