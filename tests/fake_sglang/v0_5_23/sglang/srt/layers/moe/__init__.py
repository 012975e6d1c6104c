import fake_core


def initialize_moe_config():
    fake_core.record("initialize", what="moe")
