"""The capture engine's SGLang calls against each supported release's own source: every import,
call, keyword, required parameter, attribute read or written and enum member of its adapter for
that release (stages/capture/runners.py), and that nothing is left unchecked."""

from __future__ import annotations

import ast

import pytest

from stages.capture import runners
from stages.capture.releases import SUPPORTED_VERSIONS
from tests.conftest import ROOT

from .calls import ClassWalk
from .release import missing_reason, require
from .tree_cache import TreeCacheCalls, cache_answers, missing_methods

pytestmark = pytest.mark.releases


@pytest.fixture(params=SUPPORTED_VERSIONS)
def release(request):
    return require(request.param)


def test_every_supported_release_has_its_adapter():
    assert set(runners.RUNNERS) == set(SUPPORTED_VERSIONS)


@pytest.mark.slow
def test_adapter_calls_are_the_releases(release):
    report = ClassWalk(release, runners.RUNNERS[release.version]).run()
    assert not report.problems, f"SGLang {release.version}:\n" + "\n".join(report.problems)
    assert not report.unchecked, "\n".join(report.unchecked)
    checked = "\n".join(report.checked)
    for call in ("ModelRunner(...)", "ScheduleBatch.init_new(...)", "ForwardBatch.init_new(...)"):
        assert call in checked
    assert "LogitsProcessorOutput.hidden_states" in checked
    assert len(report.checked) > 60


class OldEngine:
    """The calls the engine made before it was checked against the releases (its picture of
    SGLang), kept to show the check refuses them."""

    def __init__(self, model_config, server_args, batch):
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch
        from sglang.srt.model_executor.model_runner import ModelRunner

        runner = ModelRunner(
            model_config=model_config,
            mem_fraction_static=0.8,
            gpu_id=0,
            tp_rank=0,
            tp_size=1,
            moe_ep_rank=0,
            moe_ep_size=1,
            pp_rank=0,
            pp_size=1,
            nccl_port=1,
            server_args=server_args,
        )
        runner.init_backends(disable_cuda_graph=True)
        self.batch = ForwardBatch.init_new(batch.get_model_worker_batch(), runner)


def test_the_check_refuses_the_old_engines_calls():
    release = require("0.5.23")
    problems = "\n".join(ClassWalk(release, OldEngine).run().problems)
    assert "ModelRunner(...): keyword 'tp_rank' is no parameter of the callee" in problems
    assert "ModelRunner neither defines nor sets .init_backends" in problems
    assert "required parameter(s) ['return_hidden_states_before_norm'] not given" in problems


@pytest.mark.parametrize(
    "change, problem",
    [
        (("enable_overlap=False", "enable_overlaps=False"), "keyword 'enable_overlaps' is no"),
        (
            ("runner.alloc_memory_pool()", "runner.alloc_memory_pools()"),
            "nor sets .alloc_memory_pools",
        ),
        (("CaptureHiddenMode.FULL", "CaptureHiddenMode.ALL"), "has no member ALL"),
        (("logprob_start_len = -1", "logprob_begin = -1"), "nor sets .logprob_begin"),
    ],
)
@pytest.mark.slow
def test_a_planted_mistake_in_an_adapter_is_caught(release, change, problem):
    """The engine's own adapter with one name changed: the check names it."""
    source = ClassWalk(release, runners.RUNNERS[release.version]).source
    planted = source.replace(*change)
    assert planted != source
    problems = "\n".join(ClassWalk(release, planted).run().problems)
    assert problem in problems, problems


# One mistake in a step that only this release's adapter takes, and what the check says.
OWN_STEP_MISTAKES = {
    "0.5.14": (
        "req.fill_len = ",
        "req.fill_length = ",
        "Req neither defines nor sets .fill_length",
    ),
    "0.5.15": ("tp_rank=s.rank", "tp_ranks=s.rank", "keyword 'tp_ranks' is no parameter"),
    "0.5.16": ("dcp_size=args.dcp_size", "dcp_sizes=args.dcp_size", "keyword 'dcp_sizes'"),
    "0.5.17": ("ps=self.parallel_state(s)", "pstate=self.parallel_state(s)", "keyword 'pstate'"),
    "0.5.18": ("attn_dcp_rank=", "attn_dcp_ranks=", "keyword 'attn_dcp_ranks' is no parameter"),
    "0.5.19": ('role="scheduler")', 'roles="scheduler")', "keyword 'roles' is no parameter"),
    "0.5.20": ("initialize_moe_config()", "initialize_moe_config(self.server_args)", "takes 0"),
    "0.5.21": ("get_device().device", "get_device().devices", "nor sets .devices"),
    "0.5.22": ("req.extend_end = ", "req.extend_stop = ", "nor sets .extend_stop"),
    "0.5.23": (
        "enable_return_aux_hidden_states=True",
        "enable_return_aux_hidden_state=True",
        "keyword 'enable_return_aux_hidden_state' is no parameter",
    ),
}


@pytest.mark.slow
def test_a_mistake_in_any_adapters_own_steps_is_caught(release):
    assert set(OWN_STEP_MISTAKES) == set(SUPPORTED_VERSIONS)
    text, planted, problem = OWN_STEP_MISTAKES[release.version]
    source = ClassWalk(release, runners.RUNNERS[release.version]).source
    assert text in source
    problems = "\n".join(ClassWalk(release, source.replace(text, planted)).run().problems)
    assert problem in problems, problems


def test_prefill_only_cache_has_what_the_releases_own_driver_gives():
    """The tree cache the adapters hand to ScheduleBatch has every method of the one the
    release's own scheduler-less driver (bench_one_batch) hands it."""
    for version in SUPPORTED_VERSIONS:
        release = require(version)
        module = "sglang.bench_one_batch" if version == "0.5.14" else "sglang.benchmark.one_batch"
        theirs = release.cls(module, "TreeCacheNamespace")
        methods = {n.name for n in theirs.node.body if isinstance(n, ast.FunctionDef)}
        missing = methods - set(dir(runners.PrefillOnlyCache))
        assert not missing, f"{version}'s driver's tree cache has {missing}"


def test_prefill_only_cache_has_what_the_releases_prefill_path_calls(release):
    """Every method the release calls on the tree cache from prepare_for_extend on, the
    out-of-memory path's message among them, is the capture engine's cache's."""
    calls = TreeCacheCalls(release, cache_answers(runners.PrefillOnlyCache)).run()
    assert {"pretty_print", "available_and_evictable_str"} <= set(calls)
    assert not missing_methods(release, runners.PrefillOnlyCache)


@pytest.mark.parametrize("method", ["evict_for_alloc", "pretty_print"])
def test_a_planted_missing_cache_method_fails_the_check(method):
    """The cache without a method that 0.5.19 on call when the pool is short, or that every
    release calls on its out-of-memory path: the check names it and the chain that calls it."""
    members = {k: v for k, v in vars(runners.PrefillOnlyCache).items() if k != method}
    lacking = type("PrefillOnlyCache", (), members)
    for version in ("0.5.19", "0.5.23") if method == "evict_for_alloc" else SUPPORTED_VERSIONS:
        missing = missing_methods(require(version), lacking)
        assert method in missing and missing[method][0] == "prepare_for_extend", version


@pytest.mark.parametrize("version", [v for v in SUPPORTED_VERSIONS if v != "0.5.23"])
def test_the_final_state_is_read_where_each_model_class_keeps_it(version):
    """Kimi-K2.5's KimiK25ForConditionalGeneration has no logits processor (its language model
    has): reading it on the runner's model, as the engine did, is refused for that class, and
    the engine's own adapter reads it on each served class's language model."""
    release = require(version)
    source = ClassWalk(release, runners.RUNNERS[version]).source
    planted = source.replace(
        "self.language_model().logits_processor", "self.runner.model.logits_processor"
    )
    assert planted != source
    problems = "\n".join(ClassWalk(release, planted).run().problems)
    assert "KimiK25ForConditionalGeneration neither defines nor sets .logits_processor" in problems
    checked = ClassWalk(release, source).run().checked
    for read in (
        "KimiK25ForConditionalGeneration.language_model",
        "KimiK25ForConditionalGeneration.set_eagle3_layers_to_capture",
        "DeepseekV3ForCausalLM.logits_processor",
        "LlamaForCausalLM.logits_processor",
    ):
        assert any(c.startswith(read) for c in checked), read


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20"])
def test_the_ranks_and_pool_read_the_resolved_settings_as_the_driver_does(version):
    """0.5.19-0.5.20's driver reads the ranks and the pool's share through `resolving_view`
    (a model-specific override declares values the fields never get): so does the adapter."""
    checked = ClassWalk(require(version), runners.RUNNERS[version]).run().checked
    assert any("resolving_view(...)" in c for c in checked)


def test_only_the_capture_engine_imports_sglang():
    importers = []
    for path in (ROOT / "stages").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == "sglang" or n.startswith("sglang.") for n in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert sorted(set(importers)) == ["stages/capture/runners.py"]


# (an adapter, the next release whose runner API it cannot drive); 0.5.22's would drive 0.5.23
# too, whose own adapter takes the aux-hidden-states switch instead
NEIGHBOURS = [
    ("0.5.14", "0.5.15"),
    ("0.5.16", "0.5.18"),
    ("0.5.18", "0.5.19"),
    ("0.5.19", "0.5.21"),
    ("0.5.21", "0.5.22"),
]


@pytest.mark.slow
@pytest.mark.parametrize("written_for, other", NEIGHBOURS)
def test_an_adapter_fails_on_the_next_release_whose_api_changed(written_for, other):
    """The groups are as tight as the releases: each adapter, checked against the first release
    after its own where the API changed, is refused."""
    report = ClassWalk(require(other), runners.RUNNERS[written_for]).run()
    assert report.problems, f"the {written_for} adapter passes {other}'s source"


def test_a_missing_release_says_how_to_fetch_it():
    assert "make sglang-releases" in (missing_reason("0.0.1") or "")
