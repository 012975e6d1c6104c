"""The sglang engine against real local servers: same tokens as the in-process engine, every
sampling value on the wire, retries where a retry can help and nowhere else; and the request
stream both engines take, which may wait on replies."""

from __future__ import annotations

import socket

import pytest

from stages.engines import EngineError, Sampling
from stages.engines.sglang_http import SGLangError, parse_reply, sample_seed
from tests.engines.conftest import client, free_port

GREEDY = dict(max_new_tokens=12)


@pytest.fixture(scope="module")
def reference(hf_engine, prompts, stop_ids):
    sampling = Sampling(**GREEDY, stop_ids=stop_ids)
    return {c.sample_id: c for c in hf_engine.generate(prompts, sampling)}


def by_id(completions):
    return {c.sample_id: c for c in completions}


@pytest.mark.integration
@pytest.mark.slow
def test_same_tokens_as_the_in_process_engine(serve, hf_engine, prompts, stop_ids, reference):
    # a stop token the model does emit, so both finish reasons are exercised
    first = reference[prompts[0][0]].output_ids
    sampling = Sampling(**GREEDY, stop_ids=tuple(sorted({*stop_ids, first[3]})))
    expected = by_id(hf_engine.generate(prompts, sampling))
    got = by_id(client(serve().url).generate(prompts, sampling))
    assert {sid: (c.output_ids, c.finish_reason) for sid, c in got.items()} == {
        sid: (c.output_ids, c.finish_reason) for sid, c in expected.items()
    }
    stopped = got[prompts[0][0]]
    assert stopped.finish_reason == "stop" and stopped.output_ids[-1] == first[3]


@pytest.mark.integration
@pytest.mark.slow
def test_every_sampling_value_is_sent(serve, prompts):
    server = serve()
    sampling = Sampling(
        max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=20, seed=3, stop_ids=(2, 7)
    )
    list(client(server.url).generate(prompts[:2], sampling))
    body = next(b for b in server.received if b["rid"] == f"{prompts[1][0]}#0")
    assert body["input_ids"] == prompts[1][1] and body["stream"] is False
    assert body["sampling_params"] == {
        "max_new_tokens": 5,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "stop_token_ids": [2, 7],
        "ignore_eos": False,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "sampling_seed": sample_seed(3, prompts[1][0]),
        "n": 1,
    }
    assert sample_seed(3, "a") == sample_seed(3, "a") != sample_seed(3, "b") != sample_seed(4, "b")


@pytest.mark.integration
@pytest.mark.slow
def test_503s_and_dropped_connections_are_retried(serve, prompts, stop_ids, reference):
    server = serve()
    server.faults.unavailable, server.faults.drop_connections = 3, 2
    engine = client(server.url)
    got = by_id(engine.generate(prompts, Sampling(**GREEDY, stop_ids=stop_ids)))
    assert {s: c.output_ids for s, c in got.items()} == {
        s: c.output_ids for s, c in reference.items()
    }
    assert server.stats["unavailable"] == 3 and server.stats["dropped_connections"] == 2
    assert engine.retries == 5
    retried = [b["rid"] for b in server.received if not b["rid"].endswith("#0")]
    assert retried and all(r.rsplit("#", 1)[1] in {"1", "2", "3", "4"} for r in retried)


@pytest.mark.integration
@pytest.mark.slow
def test_retries_run_out_with_the_server_named(serve, prompts, stop_ids):
    server = serve()
    server.faults.unavailable = 1000
    with pytest.raises(
        SGLangError,
        match=r"3 attempts failed, the last: http://127\.0\.0\.1:\d+: "
        r"HTTP 503: The server is overloaded",
    ):
        list(client(server.url, max_retries=2).generate(prompts[:1], Sampling(**GREEDY)))


@pytest.mark.integration
@pytest.mark.slow
def test_a_400_is_recorded_as_abort_and_not_retried(serve, model, prompts, stop_ids, reference):
    server = serve()
    too_long = ("t/long", [1] * model.config.max_position_embeddings)
    got = by_id(
        client(server.url).generate([too_long, *prompts[:3]], Sampling(**GREEDY, stop_ids=stop_ids))
    )
    assert got["t/long"].finish_reason == "abort" and got["t/long"].output_ids == []
    assert (
        f"{server.url}: HTTP 400: The input ({len(too_long[1])} tokens) is longer than "
        f"the model's context length" in got["t/long"].error
    )
    assert [b["rid"] for b in server.received if b["rid"].startswith("t/long")] == ["t/long#0"]
    for sid, _ in prompts[:3]:
        assert got[sid].output_ids == reference[sid].output_ids


@pytest.mark.integration
@pytest.mark.slow
def test_an_abort_reply_is_recorded_with_its_message(serve, prompts):
    server = serve()
    server.faults.abort = 1
    got = list(client(server.url, concurrency=1).generate(prompts[:3], Sampling(**GREEDY)))
    assert [c.finish_reason for c in got] == ["abort", "length", "length"]
    assert got[0].error == f"{server.url}: Aborted by request"


@pytest.mark.integration
@pytest.mark.slow
def test_a_reply_without_output_ids_fails_and_says_what_to_change(serve, prompts):
    server = serve()
    server.faults.omit_output_ids = True
    with pytest.raises(SGLangError) as err:
        list(client(server.url).generate(prompts[:2], Sampling(**GREEDY)))
    message = str(err.value)
    assert "without output_ids" in message and "--skip-tokenizer-init" in message
    assert "upgrade to SGLang >= 0.5" in message and "never re-tokenized" in message


def test_a_trimmed_stop_token_is_refused():
    reply = {"output_ids": [5, 6], "meta_info": {"finish_reason": {"type": "stop", "matched": 2}}}
    with pytest.raises(SGLangError, match="ignored no_stop_trim"):
        parse_reply(reply, "s/1", "http://x", 0.1)
    reply["output_ids"].append(2)
    done = parse_reply(reply, "s/1", "http://x", 0.1)
    assert (done.output_ids, done.finish_reason, done.latency_s) == ([5, 6, 2], "stop", 0.1)
    with pytest.raises(SGLangError, match="finished with 'cancelled'"):
        parse_reply({"output_ids": [], "meta_info": {"finish_reason": "cancelled"}}, "s", "u", 0)


@pytest.mark.integration
@pytest.mark.slow
def test_requests_are_pulled_only_when_a_slot_is_free(serve, prompts):
    server = serve()
    pulled = []

    def requests():
        for r in prompts:
            pulled.append(r[0])
            yield r

    stream = client(server.url, concurrency=2).generate(requests(), Sampling(**GREEDY))
    next(stream)
    assert len(pulled) == 2
    next(stream)
    assert len(pulled) == 3
    stream.close()
    assert len(pulled) == 3


@pytest.mark.integration
@pytest.mark.slow
def test_several_servers_share_the_work_and_a_dead_one_is_routed_around(
    serve, prompts, stop_ids, reference
):
    a, b = serve(), serve()
    dead = f"http://127.0.0.1:{free_port()}"
    engine = client(a.url, b.url, dead, concurrency=2)
    got = by_id(engine.generate(prompts, Sampling(**GREEDY, stop_ids=stop_ids)))
    assert {s: c.output_ids for s, c in got.items()} == {
        s: c.output_ids for s, c in reference.items()
    }
    assert a.stats["completed"] and b.stats["completed"]
    assert a.stats["completed"] + b.stats["completed"] == len(prompts)
    assert engine.retries >= 1 and engine.in_flight == dict.fromkeys(engine.urls, 0)


@pytest.mark.slow
def test_a_silent_server_times_out_and_is_retried(prompts):
    with socket.socket() as silent:  # connections are accepted by the kernel, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        engine = client(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.2, max_retries=1)
        with pytest.raises(SGLangError, match=r"2 attempts failed, the last: .*Timeout"):
            list(engine.generate(prompts[:1], Sampling(**GREEDY)))
    assert engine.retries == 1


def waiting_stream(prompts, got):
    """Each request only once the reply to the one before it is back (a conversation's turns);
    None while it waits."""
    for sid, ids in prompts:
        while len(got) < prompts.index((sid, ids)):
            yield None
        yield sid, ids


@pytest.mark.parametrize("engine", ["sglang", "hf"])
@pytest.mark.integration
@pytest.mark.slow
def test_a_stream_that_waits_on_replies(serve, hf_engine, prompts, stop_ids, reference, engine):
    picked = prompts[:3]
    engine = client(serve().url) if engine == "sglang" else hf_engine
    got = []
    for done in engine.generate(waiting_stream(picked, got), Sampling(**GREEDY, stop_ids=stop_ids)):
        got.append(done)
    assert [c.sample_id for c in got] == [sid for sid, _ in picked]
    assert [c.output_ids for c in got] == [reference[sid].output_ids for sid, _ in picked]
    with pytest.raises(EngineError, match="none is in flight"):
        list(engine.generate(iter([None]), Sampling(**GREEDY, stop_ids=stop_ids)))


def test_the_servers_facts_are_what_their_server_info_reports(serve, model):
    """The model, dtype and quantization each server's /server_info gives, read over HTTP;
    servers that report different ones refuse the run, naming them."""
    a, b = serve(model_path="/models/t"), serve(model_path="/models/t")
    facts = client(a.url, b.url).facts()
    dtype = str(model.dtype).removeprefix("torch.")
    assert facts == {
        "served_model": "/models/t",
        "dtype": dtype,
        "quantization": None,
        "kv_cache_dtype": "auto",
    }
    other = serve(model_path="/models/other")
    with pytest.raises(SGLangError, match=r"the servers report different models or settings"):
        client(a.url, other.url).facts()
    port = free_port()
    with pytest.raises(SGLangError, match=rf"127\.0\.0\.1:{port}/server_info: Connect"):
        client(f"http://127.0.0.1:{port}").facts()
