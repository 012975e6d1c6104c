import fake_core


def initialize_moe_config(server_args):
    fake_core.record("initialize", what="moe", tp_size=server_args.tp_size)
