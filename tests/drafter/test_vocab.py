import pytest
import torch

from stages.drafter.vocab import build_draft_vocab, coverage, token_counts

from .conftest import make_drafter


def test_most_frequent_ids_sorted_with_ties_to_the_lower_id():
    counts = torch.tensor([5, 0, 3, 3, 9, 0, 1])
    d2t, t2d, used = build_draft_vocab(counts, 3)
    assert used.tolist() == [0, 2, 4]
    assert d2t.tolist() == [0, 1, 2]
    assert (torch.arange(3) + d2t).tolist() == used.tolist()
    assert t2d.nonzero().flatten().tolist() == used.tolist()
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool


def test_pads_with_the_lowest_unused_ids():
    counts = torch.tensor([0, 0, 0, 7, 0, 2, 0, 0])
    d2t, t2d, used = build_draft_vocab(counts, 4)
    assert used.tolist() == [0, 1, 3, 5]
    assert d2t.tolist() == [0, 0, 1, 2]
    assert int(t2d.sum()) == 4


def test_rejects_a_draft_vocab_larger_than_the_target():
    with pytest.raises(ValueError, match="1..3"):
        build_draft_vocab(torch.ones(3, dtype=torch.long), 4)


def test_counts_from_pairs_and_coverage():
    counts = token_counts([(1, 1), (2, 3), (3, 3)], vocab_size=5)
    assert counts.tolist() == [0, 1, 3, 3, 0]
    _, t2d, _ = build_draft_vocab(counts, 2)
    assert t2d.tolist() == [False, False, True, True, False]
    assert coverage(counts, t2d) == pytest.approx(6 / 7)


def test_counting_refuses_an_id_outside_the_vocabulary():
    with pytest.raises(ValueError, match="token id 9 is outside the target vocabulary of 5"):
        token_counts([(1, 2), (9, 1)], vocab_size=5)


def test_drafter_takes_the_built_vocabulary(target_config):
    drafter = make_drafter(target_config)
    counts = torch.randint(0, 9, (drafter.cfg.vocab_size,))
    d2t, t2d, used = build_draft_vocab(counts, drafter.cfg.draft_vocab_size)
    drafter.set_vocab(d2t, t2d)
    assert torch.equal(drafter.draft_ids(), used)
