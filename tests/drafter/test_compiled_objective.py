"""`train.compile`: the whole objective compiled as one graph computes what the eager one does."""

from __future__ import annotations

import pytest
import torch

from stages.drafter import model as model_module
from stages.drafter.model import compiled_on_gpu, rms_norm
from stages.drafter.training import Objective, compiled_objective
from stages.drafter.ttt import soft_labels

from .conftest import make_drafter


def test_inside_a_compiled_caller_the_parts_are_traced_not_compiled_apart(monkeypatch):
    """A part compiled on its own inside the compiled objective would cut its graph in pieces
    (each recompiling per dtype and step, past the limit, then eager): the step's speed-up from
    compiling lost (docs/performance.md)."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert compiled_on_gpu(rms_norm, True) is rms_norm
    assert model_module.flex_attention_kernel(True).__name__ == "flex_attention"


@pytest.mark.slow
def test_compiled_soft_labels_take_every_length_in_one_dynamic_graph(
    target, drafter, compile_without_codegen
):
    """Eager, the target's labels go `chunk` positions at a time; traced that way the graph
    would hold a copy of the chunk's kernels per chunk and guard on the chunk count, compiling
    once more for every length that adds a chunk (past the recompile limit, eager). Compiled,
    they are one pass over all rows: a static graph for the first length, one dynamic graph for
    every other, with the chunked labels' values."""
    import torch._dynamo

    head = target.lm_head.weight
    compiled = torch.compile(lambda last: soft_labels(last, drafter, head, chunk=8))
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    for length in (12, 20, 28, 44):  # 2, 3, 4 and 6 chunks of 8
        last = torch.randn(2, length, head.shape[1])
        want, got = soft_labels(last, drafter, head, chunk=8), compiled(last)
        torch.testing.assert_close(got.probs, want.probs)
        assert torch.equal(got.argmax, want.argmax) and torch.equal(got.in_vocab, want.in_vocab)
    assert counts["stats"]["unique_graphs"] == 2, dict(counts["stats"])


@pytest.mark.slow
def test_the_compiled_objective_is_one_graph_with_the_eager_loss_and_gradients(
    target, target_config, compile_without_codegen
):
    """Traced and compiled as a GPU compiles it (short of the kernels): no graph break anywhere in
    the TTT unroll, the fused loss or the metrics; loss, metrics and every gradient as the eager
    objective gives them, on batches with padding and unsupervised prompt tokens; and batches of
    other lengths, as training meets them, share one more graph with dynamic lengths instead of
    compiling again for each length."""
    drafter = make_drafter(target_config).train()
    for (want_loss, want_metrics, want_grads), (
        got_loss,
        got_metrics,
        got_grads,
    ) in eager_and_compiled(target, drafter):
        torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)
        for key, want in want_metrics.as_dict().items():
            assert got_metrics.as_dict()[key] == pytest.approx(want, rel=1e-5, nan_ok=True), key
        assert got_metrics.replayed_tau == want_metrics.replayed_tau
        for name, grad in want_grads.items():
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def eager_and_compiled(target, drafter, lengths=(24, 32, 40)):
    """(eager, compiled) loss, metrics and gradients of the drafter's objective on a batch of
    each length; once all ran: no graph break, and 2 graphs (the first length, then a dynamic
    one for every other length)."""
    import torch._dynamo

    objective = Objective(drafter, target.model.embed_tokens.weight, target.lm_head.weight, 3, 0.8)
    compiled = compiled_objective(objective)
    torch._dynamo.reset()
    counts = torch._dynamo.utils.counters
    counts.clear()
    g = torch.Generator().manual_seed(0)
    for length in lengths:
        batch = target_batch(target, drafter, length, g)
        yield loss_and_grads(objective, batch), loss_and_grads(compiled, batch)
    assert not counts["graph_break"], dict(counts["graph_break"])
    assert counts["stats"]["unique_graphs"] == 2, dict(counts["stats"])


def target_batch(target, drafter, length: int, g: torch.Generator) -> dict:
    """Two samples of the target's own features, the second padded after 3/4 of its length,
    the first 5 tokens of each unsupervised (the prompt)."""
    ids = torch.randint(0, target.config.vocab_size, (2, length), generator=g)
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
    attention_mask = torch.ones(2, length, dtype=torch.bool)
    attention_mask[1, 3 * length // 4 :] = False
    loss_mask = attention_mask.clone()
    loss_mask[:, :5] = False
    return {
        "aux": torch.cat([out.hidden_states[i] for i in drafter.cfg.aux_layer_ids], dim=-1),
        "last": out.hidden_states[-1],
        "input_ids": ids,
        "loss_mask": loss_mask,
        "attention_mask": attention_mask,
    }


def loss_and_grads(model, batch: dict):
    drafter = model.drafter if isinstance(model, Objective) else model._orig_mod.drafter
    drafter.zero_grad(set_to_none=True)
    loss, metrics = model(batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in drafter.named_parameters()}
    return loss.detach(), metrics, grads
