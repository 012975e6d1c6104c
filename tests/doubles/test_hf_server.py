"""The local server keeps SGLang's /generate contract: validation and 400s, defaults, 503 when
its queue is full, the reply's shape, /health, /model_info and /metrics."""

from __future__ import annotations

import httpx
import pytest

from stages.engines import Completion, Sampling
from stages.serving.monitor import parse_metrics
from tests.doubles.hf_server import BadRequest, _Job, parse_generate, reply


@pytest.mark.parametrize(
    "body, message",
    [
        ({"text": "hi"}, "text is not served here: send input_ids"),
        ({"input_ids": [1], "text": "hi"}, "give exactly one of input_ids, text, input_embeds"),
        ({"input_ids": []}, "input_ids must be a non-empty list of token ids"),
        ({"input_ids": [[1, 2], [3]]}, "batch requests are not served"),
        ({"input_ids": [1, "2"]}, "input_ids must hold integers only"),
        (
            {"input_ids": [1], "sampling_params": {"temprature": 0}},
            "unknown sampling parameter(s) ['temprature']",
        ),
        ({"input_ids": [1], "sampling_params": {"stop": ["\n"]}}, "stop=['\\n'] is not served"),
        (
            {"input_ids": [1] * 100},
            "The input (100 tokens) is longer than the model's context length (100 tokens).",
        ),
        (
            {"input_ids": [1] * 50, "sampling_params": {"max_new_tokens": 60}},
            "You requested a total of 110 tokens: 50 tokens from the input and 60 tokens",
        ),
    ],
)
def test_bad_requests_are_refused_as_sglang_does(body, message):
    with pytest.raises(BadRequest) as err:
        parse_generate(body, context_length=100)
    assert message in str(err.value)


def test_unset_sampling_values_take_sglang_defaults_and_the_model_eos_always_stops():
    rid, prompt, sampling, no_stop_trim = parse_generate(
        {
            "rid": "r",
            "input_ids": [1, 2],
            "sampling_params": {"top_k": None, "stop_token_ids": [9]},
        },
        context_length=1000,
        eos_ids=(2,),
    )
    assert (rid, prompt, no_stop_trim) == ("r", [1, 2], False)
    assert sampling == Sampling(
        max_new_tokens=128, temperature=1.0, top_p=1.0, top_k=-1, seed=0, stop_ids=(2, 9)
    )


def test_reply_shape_and_stop_trim():
    job = _Job("r", [1, 2, 3], Sampling(max_new_tokens=4), no_stop_trim=False)
    stopped = reply(job, Completion("r", [5, 6, 2], "stop", 0.1))
    assert stopped["output_ids"] == [5, 6]  # trimmed, as SGLang does without no_stop_trim
    meta = stopped["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": 2}
    assert (meta["id"], meta["prompt_tokens"], meta["completion_tokens"]) == ("r", 3, 3)
    job.no_stop_trim = True
    assert reply(job, Completion("r", [5, 6, 2], "stop", 0.1))["output_ids"] == [5, 6, 2]
    length = reply(job, Completion("r", [5, 6, 7, 8], "length", 0.1))
    assert length["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert "output_ids" not in reply(job, Completion("r", [5], "length", 0.1), omit_output_ids=True)


@pytest.mark.slow
@pytest.mark.integration
def test_http_endpoints(serve, model, prompts):
    server = serve(max_queued_requests=0, model_path="/models/t")
    with httpx.Client(base_url=server.url, trust_env=False) as http:
        assert http.get("/health").status_code == 200
        info = http.get("/model_info").json()
        assert info["model_path"] == "/models/t" and info["is_generation"]
        assert info["architectures"] == model.config.architectures
        metrics = parse_metrics(http.get("/metrics").text)
        assert metrics["sglang:num_running_reqs"] == [0] and metrics["sglang:num_queue_reqs"] == [0]
        full = http.post("/generate", json={"input_ids": prompts[0][1]})
        assert full.status_code == 503
        assert full.json() == {"error": {"message": "The request queue is full."}}
        server.max_queued = None
        bad = http.post("/generate", json={"input_ids": []})
        assert bad.status_code == 400 and "input_ids" in bad.json()["error"]["message"]
        ok = http.post(
            "/generate",
            json={"rid": "x", "input_ids": prompts[0][1], "sampling_params": {"max_new_tokens": 3}},
        ).json()
        assert len(ok["output_ids"]) == ok["meta_info"]["completion_tokens"] <= 3
        assert http.get("/nowhere").status_code == 404
        assert parse_metrics(http.get("/metrics").text)["sglang:generation_tokens_total"] == [
            ok["meta_info"]["completion_tokens"]
        ]
        server.ready.clear()
        assert http.get("/health").status_code == 503
        assert http.post("/generate", json={"input_ids": [1]}).status_code == 503
