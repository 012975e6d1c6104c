import pytest

from stages.engines import Sampling, trim_at_stop
from stages.engines.hf import HFEngine
from stages.target_model.model import load_causal_lm


@pytest.fixture(scope="module")
def engine(stories_path):
    return HFEngine(load_causal_lm(str(stories_path)), pad_id=0, batch_size=4)


PROMPTS = [("a", [1]), ("b", [1, 403, 261, 376]), ("c", [1, 400, 401, 300, 310, 320, 330])]


def test_batched_greedy_equals_one_at_a_time(engine):
    greedy = Sampling(max_new_tokens=24, stop_ids=(2,))
    batched = {c.sample_id: c.output_ids for c in engine.generate(PROMPTS, greedy)}
    for sid, prompt in PROMPTS:
        (alone,) = engine.generate([(sid, prompt)], greedy)
        assert alone.output_ids == batched[sid]
        assert alone.finish_reason == "length" and len(alone.output_ids) == 24


def test_stop_token_kept_and_finish_reason(engine):
    (first,) = engine.generate([PROMPTS[0]], Sampling(max_new_tokens=8))
    stop = first.output_ids[3]  # make the 4th generated token a stop token
    (done,) = engine.generate([PROMPTS[0]], Sampling(max_new_tokens=8, stop_ids=(stop,)))
    assert done.finish_reason == "stop"
    assert done.output_ids[-1] == stop and len(done.output_ids) == first.output_ids.index(stop) + 1


def test_over_context_is_an_abort_with_the_reason(engine):
    long_prompt = [1] + [300] * 600  # stories260K has a 512-token context
    out = list(engine.generate([("long", long_prompt), PROMPTS[0]], Sampling(max_new_tokens=4)))
    by = {c.sample_id: c for c in out}
    assert by["long"].finish_reason == "abort" and "over the context length 512" in by["long"].error
    assert by["a"].finish_reason == "length"


def test_sampling_is_seeded(engine):
    hot = Sampling(max_new_tokens=16, temperature=1.5, seed=7)
    one = [c.output_ids for c in engine.generate(PROMPTS, hot)]
    two = [c.output_ids for c in engine.generate(PROMPTS, hot)]
    other = [c.output_ids for c in engine.generate(PROMPTS, Sampling(16, 1.5, seed=8))]
    assert one == two and one != other


def test_requests_are_pulled_lazily(engine):
    pulled = []

    def requests():
        for r in PROMPTS * 3:
            pulled.append(r[0])
            yield r

    gen = engine.generate(requests(), Sampling(max_new_tokens=2))
    next(gen)
    assert len(pulled) == 4  # one batch, not the whole stream


def test_trim_at_stop():
    assert trim_at_stop([5, 6, 2, 0, 0], [2], 5) == ([5, 6, 2], "stop")
    assert trim_at_stop([5, 6, 7], [2], 3) == ([5, 6, 7], "length")
