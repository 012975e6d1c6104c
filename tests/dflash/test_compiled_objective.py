"""`dflash.compile`: the DFlash objective compiled as a GPU compiles it (short of the kernels)
computes what the eager one does, in one graph from the anchors on."""

from __future__ import annotations

import copy

import pytest

from stages.dflash.objective import DFlashObjective
from stages.drafter.training import compiled_objective

from .conftest import make_drafter, random_batch, target_weights


@pytest.mark.slow
def test_compiled_it_is_one_graph_with_the_eager_loss_and_gradients(
    target_config, compile_without_codegen
):
    """The anchors are drawn eagerly (the one graph break, by design: a CPU generator and a
    data-dependent count do not trace); the block forward, loss and metrics are one graph for the
    first length and one dynamic graph for every other. Both draw the same anchors from the same
    seed, so loss and every gradient match."""
    import torch._dynamo

    eager_drafter = make_drafter(target_config)
    embed, head = target_weights(eager_drafter.cfg)
    eager = DFlashObjective(eager_drafter, embed, head, num_anchors=3, decay_gamma=4.0, seed=5)
    twin = DFlashObjective(
        copy.deepcopy(eager_drafter), embed, head, num_anchors=3, decay_gamma=4.0, seed=5
    )
    compiled = compiled_objective(twin)
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    for lengths in ([20, 14], [28, 21], [36, 30]):
        batch = random_batch(eager_drafter.cfg, lengths)
        (want, want_metrics), (got, got_metrics) = eager(batch), compiled(batch)
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert got_metrics.tau == pytest.approx(want_metrics.tau, rel=1e-6)
        for (name, a), (_, b) in zip(
            eager_drafter.named_parameters(), twin.drafter.named_parameters(), strict=True
        ):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)
            a.grad = b.grad = None
    breaks = dict(counts["graph_break"])
    assert breaks and all("anchors" in reason for reason in breaks), breaks
    assert counts["stats"]["unique_graphs"] == 2, dict(counts["stats"])
