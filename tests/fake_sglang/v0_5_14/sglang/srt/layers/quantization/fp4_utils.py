import fake_core


def initialize_fp4_gemm_config(server_args):
    fake_core.record("initialize", what="fp4", tp_size=server_args.tp_size)
