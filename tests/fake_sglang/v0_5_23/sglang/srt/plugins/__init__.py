import fake_core


def load_plugins():
    fake_core.record("load_plugins")
