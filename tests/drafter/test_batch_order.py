"""`batch_order`: the epoch's seeded order, with batches grouped by length when asked."""

from __future__ import annotations

import torch

from stages.drafter.training import batch_order


def padding_share(lengths: list[int], order: list[int], batch_size: int) -> float:
    """Of the positions collate makes (each batch padded to its longest), the padding."""
    positions = tokens = 0
    for start in range(0, len(order), batch_size):
        batch = [lengths[i] for i in order[start : start + batch_size]]
        positions, tokens = positions + len(batch) * max(batch), tokens + sum(batch)
    return 1 - tokens / positions


def reasoning_lengths(n: int) -> list[int]:
    """Prompt plus reply lengths as a generation run gives them: 100-600 + 200-1,800 tokens."""
    g = torch.Generator().manual_seed(7)
    prompts = torch.randint(100, 600, (n,), generator=g)
    return (prompts + torch.randint(200, 1800, (n,), generator=g)).tolist()


def test_window_1_is_the_plain_seeded_shuffle():
    lengths = reasoning_lengths(50)
    g = torch.Generator().manual_seed(3 * 1_000_003 + 2)
    assert batch_order(lengths, 3, 2, 4, 1) == torch.randperm(50, generator=g).tolist()


def test_grouped_batches_pad_far_less_and_each_is_cut_from_its_window_sorted():
    lengths, batch_size, window = reasoning_lengths(1000), 8, 16
    plain = batch_order(lengths, 0, 0, batch_size, 1)
    grouped = batch_order(lengths, 0, 0, batch_size, window)
    assert sorted(grouped) == list(range(1000))
    span = batch_size * window
    for start in range(0, 1000, span):  # each window: the same samples as the plain order's
        assert sorted(grouped[start : start + span]) == sorted(plain[start : start + span])
        run = sorted(lengths[i] for i in plain[start : start + span])
        batches = [
            sorted(lengths[i] for i in grouped[b : b + batch_size])
            for b in range(start, min(start + span, 1000), batch_size)
        ]
        assert sorted(batches) == [run[i : i + batch_size] for i in range(0, len(run), batch_size)]
    before, after = (padding_share(lengths, o, batch_size) for o in (plain, grouped))
    assert before > 0.25 and after < before / 5, (before, after)
    # the batches' order stays random: not sorted by length within a window
    maxima = [max(lengths[i] for i in grouped[b : b + batch_size]) for b in range(0, span, 8)]
    assert maxima != sorted(maxima)


def test_the_short_last_batch_stays_last_and_orders_are_seeded_per_epoch():
    lengths = reasoning_lengths(30)  # 7 batches of 4, then 2
    order = batch_order(lengths, 0, 0, 4, 3)
    assert sorted(order) == list(range(30))
    assert len(order[28:]) == 2 and set(order[28:]) <= set(batch_order(lengths, 0, 0, 4, 1)[24:])
    assert order == batch_order(lengths, 0, 0, 4, 3)
    assert order != batch_order(lengths, 0, 1, 4, 3)
