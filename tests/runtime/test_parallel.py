"""The process group's bound on a wait for the other ranks (EAGLE_COLLECTIVE_TIMEOUT_S) and the one
line a failed collective ends a stage with; tests/runtime/test_rank_killed.py runs both under
torchrun."""

from __future__ import annotations

import errno
import sys

import pytest
import torch

from stages.cli import run
from stages.runtime.parallel import (
    DEFAULT_TIMEOUT_S,
    TIMEOUT_ENV,
    CollectiveFailed,
    Rank,
    collective_failures_named,
    timeout_s,
)

GLOO_RESET = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:29348: Connection reset by peer. This is typically caused by a remote worker "
    "hanging or bugs in the application."
)


@pytest.mark.parametrize(
    "value, seconds", [(None, DEFAULT_TIMEOUT_S), ("", DEFAULT_TIMEOUT_S), (" 5 ", 5.0)]
)
def test_the_timeout_comes_from_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(TIMEOUT_ENV, value)
    assert timeout_s() == seconds


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_a_timeout_that_is_no_positive_number_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=rf"^{TIMEOUT_ENV}='{value}': expected seconds above 0"):
        timeout_s()


@pytest.mark.parametrize(
    "error, said",
    [
        (RuntimeError(GLOO_RESET), "Read error [127.0.0.1]:29348: Connection reset by peer"),
        (torch.distributed.DistBackendError("NCCL error: remote process exited"), "NCCL error"),
    ],
)
def test_a_failed_collective_becomes_one_line_naming_the_rank_and_the_setting(
    monkeypatch, error, said
):
    monkeypatch.setenv(TIMEOUT_ENV, "60")
    with pytest.raises(CollectiveFailed) as failed, collective_failures_named(Rank(1, 2)):
        raise error
    assert failed.value.errno == errno.ECONNABORTED
    assert failed.value.strerror.startswith(f"rank 1 of 2: a collective failed ({said}")
    assert f"within 60 s ({TIMEOUT_ENV}); what was finished is kept" in failed.value.strerror


@pytest.mark.parametrize(
    "rank, error",
    [(Rank(0, 2), RuntimeError("shape mismatch")), (Rank(), RuntimeError(GLOO_RESET))],
)
def test_other_errors_and_one_process_pass_unchanged(rank, error):
    with pytest.raises(RuntimeError) as raised, collective_failures_named(rank):
        raise error
    assert raised.value is error


def test_the_stage_prints_the_one_line(monkeypatch, capsys):
    def main() -> None:
        with collective_failures_named(Rank(0, 2)):
            raise RuntimeError(GLOO_RESET)

    monkeypatch.setattr(sys, "argv", ["stage"])
    with pytest.raises(SystemExit) as ended:
        run(main)
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: [Errno 103] rank 0 of 2: a collective failed (Read error")
    assert err.count("\n") == 1
