"""The sglang engine's soak at full size (tests/perf/soak_sglang.py): 20,000 requests against the
local SGLang-protocol server failing every 10th /generate and restarted twice."""

from __future__ import annotations

import pytest

from tests.perf.soak_sglang import FAULT_EVERY, RSS_GROWTH_MIB, soak

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]


def test_every_sample_once_with_the_fault_free_ids_and_the_client_memory_flat():
    result = soak(requests=20000, restarts=2)
    assert (result.missing, result.duplicated, result.wrong_ids) == (0, 0, 0), result.lines()
    faults = result.unavailable + result.dropped
    assert faults >= result.requests // FAULT_EVERY and result.retries >= faults, result.lines()
    assert result.rss_end_mib - result.rss_start_mib < RSS_GROWTH_MIB, result.lines()
