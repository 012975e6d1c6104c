"""A target model, prompt files and local SGLang-compatible servers for the engine tests.

The target is the demo target when it has been built, else stories260K with a plain chat
template; generation is greedy on CPU in float32 so every engine must give the same tokens.
"""

from __future__ import annotations

import json
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from stages.artifacts.prompts import PROMPTS_SCHEMA
from stages.engines.hf import HFEngine
from stages.engines.sglang_http import SGLangEngine
from stages.params.target import TargetParams
from stages.target_model.model import load_causal_lm
from stages.target_model.tokenizer import pad_id
from stages.wiring.target import target_roles, target_tokenizer
from tests.conftest import DEMO_TARGET, STORIES, STORIES_REL, require_shared
from tests.doubles.hf_server import HFServer, model_eos_ids

STORY_TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}"
OPENINGS = [
    "Once upon a time there was a cat",
    "The little girl saw a big dog",
    "Tom wanted to play in the park",
    "One day a bird found a shiny stone",
    "Lily and Ben went to the sea",
    "The sun was hot and the boy was sad",
    "A small fish lived in a pond",
    "Mom gave Sue a red ball",
    "The old tree in the garden",
    "A friendly bear liked honey",
    "Sam lost his blue hat",
    "The kitten was hungry",
]


@pytest.fixture(scope="session")
def target(tmp_path_factory) -> TargetParams:
    if (DEMO_TARGET / "config.json").exists():
        return TargetParams(path=str(DEMO_TARGET), device="cpu", dtype="float32")
    require_shared(STORIES_REL)  # the fallback reads ../shared: skipped (in CI failed) without it
    template = tmp_path_factory.mktemp("target") / "chat_template.jinja"
    template.write_text(STORY_TEMPLATE)
    return TargetParams(
        path=str(STORIES), chat_template=str(template), device="cpu", dtype="float32"
    )


@pytest.fixture(scope="session")
def tokenizer(target):
    return target_tokenizer(target)


@pytest.fixture(scope="session")
def model(target):
    return load_causal_lm(target.path, "cpu", "float32")


@pytest.fixture(scope="session")
def stop_ids(target, tokenizer) -> tuple[int, ...]:
    return tuple(target_roles(target, tokenizer).stop_ids)


@pytest.fixture(scope="session")
def hf_engine(model, tokenizer) -> HFEngine:
    return HFEngine(model, pad_id(tokenizer), batch_size=8)


@pytest.fixture(scope="session")
def prompts(target, tokenizer) -> list[tuple[str, list[int]]]:
    return [
        (
            f"t/{i}",
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,
                **target.template_kwargs,
            ),
        )
        for i, text in enumerate(OPENINGS)
    ]


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread(monkeypatch_package):
    """Tiny models on a shared 2-core machine: a second intra-op thread only spins (a greedy
    batch takes 0.1 s on one thread and up to 20 s on two when the other core is busy)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch_package.setenv("OMP_NUM_THREADS", "1")  # for the servers started as processes
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="package")
def monkeypatch_package():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="session")
def prompts_file(tmp_path_factory, prompts, target, tokenizer):
    """The prep stage's artifact for `prompts`, as dataset `t`."""
    think = target_roles(target, tokenizer).think
    rows = [
        dict(
            sample_id=sid,
            dataset="t",
            tools=None,
            prompt_ids=ids,
            prompt_len=len(ids),
            messages=json.dumps([{"role": "user", "content": OPENINGS[i]}]),
            reasoning_open=think is not None and ids[-1] == think,
        )
        for i, (sid, ids) in enumerate(prompts)
    ]
    path = tmp_path_factory.mktemp("prompts") / "t.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=PROMPTS_SCHEMA), path)
    return path


@pytest.fixture
def serve(model, tokenizer):
    """Start HF-backed SGLang-compatible servers; all are stopped after the test."""
    servers = []

    def start(**options) -> HFServer:
        engine = HFEngine(model, pad_id(tokenizer), batch_size=8)
        server = HFServer(engine, eos_ids=model_eos_ids(model), **options).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def client(*urls: str, **options) -> SGLangEngine:
    """The sglang engine with retries fast enough for tests."""
    settings = dict(concurrency=4, max_retries=4, backoff_s=0.001, backoff_max_s=0.01) | options
    return SGLangEngine(list(urls), **settings)


def free_port() -> int:
    """A port nothing listens on (yet)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
