"""A user's params mistakes, caught by `dvc repro` before any work: the `check` stage runs first
(it depends on the whole params.yaml, every other stage on its output), so a typo or a bad value
stops the run with one line naming the key, no traceback, and every earlier output as it was; a
check that passes reruns nothing else."""

from __future__ import annotations

import hashlib
import re

import pytest
import yaml

from stages.params.train import TrainParams
from tests.project import copy_project, ran_stages, set_params, sh

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow, pytest.mark.integration]


def small(p: dict) -> None:
    for name in list(p["datasets"])[1:]:
        del p["datasets"][name]
    (ds,) = p["datasets"].values()
    ds["prep"]["max_samples"] = 2


def first_dataset(p: dict) -> dict:
    return next(iter(p["datasets"].values()))


def setter(*path, value):
    """An edit of params setting the key at `path` (datasets.* is the one dataset)."""

    def edit(p: dict) -> None:
        node = first_dataset(p) if path[0] == "datasets.*" else p[path[0]]
        for key in path[1:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value

    return edit


def typo(section, wrong):
    def edit(p: dict) -> None:
        p.get(section, p).update({wrong: 1})  # "top": a top-level key

    return edit


# (what the user wrote, the edit, what the one error line must name)
MISTAKES = [
    ("train.learning_rate (meant lr)", typo("train", "learning_rate"), "train.learning_rate"),
    ("a misspelt section", typo("top", "trian"), "trian"),
    ("generate.max_tokens", typo("generate", "max_tokens"), "generate.max_tokens"),
    ("merge.evalfraction", typo("merge", "evalfraction"), "merge.evalfraction"),
    ("quality.min_reasoning", typo("quality", "min_reasoning"), "quality.min_reasoning"),
    ("vocab.size", typo("vocab", "size"), "vocab.size"),
    ("extract.layer", typo("extract", "layer"), "extract.layer"),
    ("benchmark.steps", typo("benchmark", "steps"), "benchmark.steps"),
    ("report.samples", typo("report", "samples"), "report.samples"),
    ("target.trust_remote", typo("target", "trust_remote"), "target.trust_remote"),
    ("budget -5", setter("datasets.*", "generate", "budget_tokens", value=-5), "budget_tokens"),
    ("max_samples -3", setter("datasets.*", "prep", "max_samples", value=-3), "max_samples"),
    (
        "max_prompt_tokens 0",
        setter("datasets.*", "prep", "max_prompt_tokens", value=0),
        "max_prompt",
    ),
    ("regenerate typo", setter("datasets.*", "prep", "regenerate", value="all"), "regenerate"),
    ("generate.batch_size 0", setter("generate", "batch_size", value=0), "generate.batch_size"),
    ("max_new_tokens -1", setter("generate", "max_new_tokens", value=-1), "max_new_tokens"),
    ("temperature -1", setter("generate", "temperature", value=-1.0), "generate.temperature"),
    ("top_p 1.5", setter("generate", "top_p", value=1.5), "generate.top_p"),
    ("engine vllm", setter("generate", "engine", value="vllm"), "generate.engine"),
    ("concurrency 0", setter("generate", "sglang", "concurrency", value=0), "concurrency"),
    ("eval_fraction 2", setter("merge", "eval_fraction", value=2.0), "merge.eval_fraction"),
    ("max_length a string", setter("merge", "max_length", value="long"), "merge.max_length"),
    ("max_failed 1.5", setter("quality", "max_failed", value=1.5), "quality.max_failed"),
    ("draft vocab 0", setter("vocab", "draft_vocab_size", value=0), "vocab.draft_vocab_size"),
    ("layers [2, 2, 4]", setter("extract", "layers", value=[2, 2, 4]), "extract.layers"),
    ("layers past the depth", setter("extract", "layers", value=[2, 4, 9]), "extract.layers"),
    ("shard_tokens 0", setter("extract", "shard_tokens", value=0), "extract.shard_tokens"),
    ("store some", setter("extract", "store", value="some"), "extract.store"),
    ("canary max_rel_error 0", setter("extract", "canary", "max_rel_error", value=0.0), "max_rel"),
    ("train.batch_size 0", setter("train", "batch_size", value=0), "train.batch_size"),
    ("train.lr -1", setter("train", "lr", value=-1.0), "train.lr"),
    ("decay 0", setter("train", "decay", value=0.0), "train.decay"),
    ("ttt_steps 0", setter("train", "ttt_steps", value=0), "train.ttt_steps"),
    ("benchmark.num_steps 0", setter("benchmark", "num_steps", value=0), "num_steps"),
    ("benchmark.mode x", setter("benchmark", "mode", value="served"), "benchmark.mode"),
    ("report.max_chars 0", setter("report", "max_chars", value=0), "report.max_chars"),
    # values a stage refused only once it ran, after generate had emptied data/raw
    ("target.dtype float8", setter("target", "dtype", value="float8"), "target.dtype"),
    ("target.device gpu", setter("target", "device", value="gpu"), "target.device"),
    ("train.device tpu", setter("train", "device", value="tpu"), "train.device"),
    # files and names a later stage found out about, naming a path instead of the key
    ("target.path missing", setter("target", "path", value="models/nope"), "target.path"),
    (
        "dataset path missing",
        setter("datasets.*", "prep", "path", value="data/nope.jsonl"),
        "prep.path",
    ),
    ("format unknown", setter("datasets.*", "prep", "format", value="sharegtp"), "prep.format"),
    (
        "chat_template missing",
        setter("target", "chat_template", value="templates/nope.jinja"),
        "target.chat_template",
    ),
    (
        "sglang_version banana",
        setter("train", "sglang_version", value="banana"),
        "train.sglang_version",
    ),
]


def digest(repo, rels) -> dict[str, str]:
    return {r: hashlib.sha256((repo / r).read_bytes()).hexdigest() for r in rels}


@pytest.fixture(scope="module")
def repo(tmp_path_factory, demo_target):
    repo = copy_project(tmp_path_factory.mktemp("project"), small)
    name = next(iter(yaml.safe_load((repo / "params.yaml").read_text())["datasets"]))
    first = sh(["dvc", "repro", f"prep@{name}"], repo)
    assert ran_stages(first.stdout) == {"check", f"prep@{name}"}, first.stdout
    sh(["git", "add", "-A"], repo)
    sh(["git", "commit", "-qm", "first run"], repo)
    return repo, [f"data/prompts/{name}.parquet", f"reports/prep/{name}.json", "reports/check.json"]


def test_at_least_30_mistakes_across_every_section():
    sections = {named.split(".")[0] for _, _, named in MISTAKES if "." in named}
    assert len(MISTAKES) >= 30
    assert {"train", "generate", "merge", "quality", "vocab", "extract", "benchmark"} <= sections


@pytest.mark.parametrize("what, edit, named", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_params_mistake_stops_the_run_before_any_work(repo, what, edit, named):
    repo, outputs = repo
    before = digest(repo, outputs)
    sh(["git", "checkout", "-q", "params.yaml"], repo)
    set_params(repo, edit)
    proc = sh(["dvc", "repro"], repo, check=False)
    out = proc.stdout + proc.stderr
    sh(["git", "checkout", "-q", "params.yaml"], repo)
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and named in errors[0], out
    assert ran_stages(out) == {"check"}, out
    assert digest(repo, outputs) == before


def test_a_passing_check_reruns_nothing_else(repo):
    repo, outputs = repo
    before = digest(repo, outputs)
    set_params(repo, lambda p: p["generate"].update(append_every=7))  # shapes no output
    proc = sh(["dvc", "repro", "prep@" + outputs[0].split("/")[-1].split(".")[0]], repo)
    sh(["git", "checkout", "-q", "params.yaml"], repo)
    assert ran_stages(proc.stdout) == {"check"}, proc.stdout
    assert digest(repo, outputs) == before


def test_a_stage_that_fails_leaves_its_earlier_outputs(repo):
    """A failure the params check cannot see (the dataset file broken): prep fails, and its
    earlier prompts and report are where they were, readable."""
    repo, outputs = repo
    before = digest(repo, outputs)
    params = yaml.safe_load((repo / "params.yaml").read_text())
    source = repo / first_dataset(params)["prep"]["path"]
    source.write_text("{ not json\n" * 3)
    proc = sh(["dvc", "repro"], repo, check=False)
    sh(["git", "checkout", "-q", "--", str(source.relative_to(repo))], repo)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out
    assert digest(repo, outputs) == before


def test_a_number_dvc_reads_as_a_float_the_check_reads_as_one(repo):
    """`3e-3` is a float by YAML 1.2, the rules DVC reads params.yaml by (`dvc exp run -S`
    writes such values): the check and the stages read it so too, not as the string YAML 1.1
    makes of it."""
    repo, _ = repo
    path = repo / "params.yaml"
    text = path.read_text()
    assert re.search(r"(?m)^  lr: \S+", text)
    path.write_text(re.sub(r"(?m)^  lr: \S+", "  lr: 3e-3", text, count=1))
    typed = sh(["dvc", "repro", "check"], repo, check=False)
    sh(["git", "checkout", "-q", "params.yaml"], repo)
    assert typed.returncode == 0, typed.stdout + typed.stderr
    proc = sh(["dvc", "exp", "run", "-S", "train.lr=3e-3", "check"], repo, check=False)
    lr = TrainParams.read(path).lr
    sh(["git", "checkout", "-q", "params.yaml"], repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lr == 0.003
