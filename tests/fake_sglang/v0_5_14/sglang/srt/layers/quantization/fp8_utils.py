import fake_core


def initialize_fp8_gemm_config(server_args):
    fake_core.record("initialize", what="fp8", tp_size=server_args.tp_size)
