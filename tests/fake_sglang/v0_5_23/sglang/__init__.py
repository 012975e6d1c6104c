"""Stand-in for SGLang 0.5.23 (tests/fake_sglang): the modules, names and signatures of the
release that stages/capture/runners.py uses, checked against the release itself by
tests/sglang_contract/test_stand_in.py. The version is the installed distribution's."""
