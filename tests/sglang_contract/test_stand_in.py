"""The test stand-ins (tests/fake_sglang) held to the releases they stand for: parameter by
parameter, attribute by attribute, member by member; a planted mismatch fails the check."""

from __future__ import annotations

import shutil

import pytest

from stages.capture.releases import SUPPORTED_VERSIONS
from tests import fake_sglang

from .release import require
from .stand_in import stand_in_problems

pytestmark = pytest.mark.releases


@pytest.fixture(params=fake_sglang.STAND_INS)
def release(request):
    return require(request.param)


def test_every_stand_in_is_of_a_supported_release():
    assert set(fake_sglang.STAND_INS) <= set(SUPPORTED_VERSIONS)
    for version in fake_sglang.STAND_INS:
        assert (fake_sglang.stand_in(version) / "sglang" / "__init__.py").exists()


def test_the_stand_in_follows_the_release(release):
    problems = stand_in_problems(release, fake_sglang.stand_in(release.version), fake_sglang.CORE)
    assert not problems, f"stand-in of SGLang {release.version}:\n" + "\n".join(problems)


PLANTED = [
    # (file: under sglang/srt, or "core" for fake_core.py; text; planted text; what is said)
    (
        "model_executor/model_runner.py",
        "        server_args,\n",
        "        server_args,\n        tp_rank_hint=0,\n",
        "parameter 'tp_rank_hint' is not the release's",
    ),
    (
        "core",
        "    def alloc_memory_pool(self, memory_pool_config=None):",
        "    def alloc_memory_pool(self, memory_pool_config):",
        "parameter 'memory_pool_config' is required, the release's is optional",
    ),
    (
        "core",
        "        self.logprob_start_len = 0\n",
        "        self.logprob_start_len = 0\n        self.fill_ids = []\n",
        "Req.fill_ids: the release's class neither defines nor sets it",
    ),
    (
        "managers/schedule_batch.py",
        "class ScheduleBatch(_ScheduleBatch):\n",
        "class ScheduleBatch(_ScheduleBatch):\n    def get_model_worker_batch(self):\n"
        "        return self\n\n",
        "ScheduleBatch.get_model_worker_batch: the release's class has no such method",
    ),
    (
        "core",
        "    model_path: str\n",
        "    model_path: str\n    tp_rank: int = 0\n",
        "ServerArgs.__init__(): parameter 'tp_rank' is not the release's",
    ),
    (
        "core",
        "    def set_eagle3_layers_to_capture(self, layer_ids=None):",
        "    def set_eagle3_layers_to_capture(self, layer_ids=None, shift=0):",
        "set_eagle3_layers_to_capture(): parameter 'shift' is not the release's",
    ),
    (
        "core",
        "    FULL = auto()\n",
        "    FULL = auto()\n    EVERY = auto()\n",
        "enum members ['EVERY'] are not the release's",
    ),
]


@pytest.mark.parametrize("where, text, planted, says", PLANTED)
def test_a_planted_mismatch_fails_the_check(release, where, text, planted, says, tmp_path):
    """A copy of the stand-in (and its shared core) with one change: the check names it."""
    copy = tmp_path / "stand-in"
    shutil.copytree(fake_sglang.stand_in(release.version), copy)
    core = tmp_path / "fake_core.py"
    shutil.copy(fake_sglang.CORE, core)
    path = core if where == "core" else copy / "sglang" / "srt" / where
    source = path.read_text()
    assert text in source
    path.write_text(source.replace(text, planted, 1))
    problems = "\n".join(stand_in_problems(release, copy, core))
    assert says in problems, problems
