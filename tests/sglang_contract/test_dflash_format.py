"""The DFlash export against each supported release's own source (srt/models/dflash.py and
srt/speculative/dflash_utils.py, read with `ast`): every dflash_config key is one that release's
`parse_dflash_draft_config` reads there, every other config key one its model or parser reads (or
one read outside these files, listed below), every weight name one its `load_weights` places on
a parameter, and the default target layers its own `build_target_layer_ids` computes."""

from __future__ import annotations

import ast
import json

import pytest
from safetensors import safe_open

from stages.capture.releases import SUPPORTED_VERSIONS
from stages.dflash.export import export_dflash
from stages.dflash.layers import default_target_layer_ids
from stages.drafter.export import CONFIG_FILE, PROJECT_KEY, WEIGHTS_FILE
from tests.dflash.conftest import make_drafter, tiny_target_config

from .release import Release, require

pytestmark = pytest.mark.releases

MODEL, UTILS = "sglang.srt.models.dflash", "sglang.srt.speculative.dflash_utils"
# Config keys SGLang reads outside dflash.py / dflash_utils.py, and where.
READ_ELSEWHERE = {
    "architectures": "the model registry (dflash.py's EntryClass, checked below)",
    "model_type": "transformers' AutoConfig, which builds the Qwen3 text config",
    "dtype": "configs/model_config.py, the --dtype auto rule",
    "torch_dtype": "configs/model_config.py, the --dtype auto rule",
    "rope_theta": "utils/hf_transformers get_rope_config",
    "rope_scaling": "utils/hf_transformers get_rope_config",
    "rope_parameters": "utils/hf_transformers get_rope_config (transformers 5)",
    "vocab_size": "the model config; the worker checks mask_token_id against it",
    "tie_word_embeddings": "transformers (no head of its own to tie)",
    PROJECT_KEY: "nobody: this project's record of the training",
}
# Which class of the release owns each module path of a weight name (`#`: a layer index).
OWNERS = {
    "": "DFlashDraftModel",
    "layers.#": "DFlashDecoderLayer",
    "layers.#.self_attn": "DFlashAttention",
    "layers.#.mlp": "DFlashMLP",
}


@pytest.fixture(params=SUPPORTED_VERSIONS)
def release(request):
    return require(request.param)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    target = tiny_target_config()
    out = export_dflash(make_drafter(target), tmp_path_factory.mktemp("dflash") / "d", target)
    with safe_open(str(out / WEIGHTS_FILE), framework="pt") as f:
        names = list(f.keys())
    return json.loads((out / CONFIG_FILE).read_text()), names


def tree(release: Release, dotted: str) -> ast.Module:
    module = release.module(dotted)
    assert module is not None, f"SGLang {release.version} has no {dotted}"
    return module.tree


def read_keys(release: Release) -> tuple[set[str], set[str]]:
    """(dflash_config keys, other config keys) the two files read: `dflash_cfg.get("k")`;
    `getattr(x, "k")`, `_cfg_get(x, "k")` and `config.k` / `text_config.k`."""
    nested, top = set(), set()
    for dotted in (MODEL, UTILS):
        for node in ast.walk(tree(release, dotted)):
            if isinstance(node, ast.Call):
                func, args = ast.unparse(node.func), node.args
                if func == "dflash_cfg.get" and args and isinstance(args[0], ast.Constant):
                    nested.add(args[0].value)
                named = len(args) >= 2 and isinstance(args[1], ast.Constant)
                if func in ("getattr", "_cfg_get") and named:
                    top.add(args[1].value)
            if isinstance(node, ast.Attribute) and ast.unparse(node.value) in (
                "config",
                "text_config",
            ):
                top.add(node.attr)
    return nested, top


def stacked_mapping(release: Release) -> list[tuple[str, str]]:
    """(param, weight) pairs of `load_weights`' stacked_params_mapping."""
    found = release.cls(MODEL, "DFlashDraftModel").method("load_weights")
    assert found is not None, f"SGLang {release.version}: DFlashDraftModel has no load_weights"
    for node in ast.walk(found[1]):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == (
            "stacked_params_mapping"
        ):
            return [(p, w) for p, w, _ in ast.literal_eval(node.value)]
    raise AssertionError(f"SGLang {release.version}: load_weights stacks no q/k/v")


def weight_problems(release: Release, names: list[str]) -> list[str]:
    """Names `load_weights` would skip: after its q/k/v and gate/up stacking, each module path
    must be an attribute its owning class sets, ending in a parameter `weight`."""
    mapping = stacked_mapping(release)
    problems = []
    for name in names:
        mapped = next((name.replace(w, p) for p, w in mapping if f".{w}." in name), name)
        *path, leaf = mapped.split(".")
        if leaf != "weight":
            problems.append(f"{name}: no parameter `{leaf}` in SGLang {release.version}")
            continue
        owner_path = ".".join("#" if part.isdigit() else part for part in path[:-1])
        owner = OWNERS.get(owner_path)
        attributes = release.cls(MODEL, owner).attributes() if owner else frozenset()
        if path[-1] not in attributes:
            problems.append(
                f"{name}: SGLang {release.version}'s {owner or owner_path} sets no "
                f"`{path[-1]}`; load_weights skips it"
            )
    return problems


def config_problems(release: Release, config: dict) -> list[str]:
    nested, top = read_keys(release)
    problems = [
        f"dflash_config.{key}: SGLang {release.version}'s parse_dflash_draft_config never reads it"
        for key in sorted(config["dflash_config"])
        if key not in nested
    ]
    problems += [
        f"{key}: SGLang {release.version}'s DFlash model and parser never read it"
        for key in sorted(set(config) - {"dflash_config"} - set(READ_ELSEWHERE))
        if key not in top
    ]
    entry = ast.unparse(_assigned(tree(release, MODEL), "EntryClass"))
    if config["architectures"][0] not in entry:
        problems.append(f"architectures {config['architectures']}: not in EntryClass {entry}")
    return problems


def _assigned(module: ast.Module, name: str) -> ast.expr:
    for node in module.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == name:
            return node.value
    raise AssertionError(f"no {name}")


def test_the_config_holds_only_keys_the_release_reads(release, exported):
    assert config_problems(release, exported[0]) == []


def test_every_weight_lands_on_a_parameter_of_the_release(release, exported):
    assert weight_problems(release, exported[1]) == []


def test_mask_token_id_is_read_at_the_top_level_only_from_0_5_18(release):
    nested, _ = read_keys(release)
    parse = ast.unparse(_function(tree(release, UTILS), "parse_dflash_draft_config"))
    assert "mask_token_id" in nested
    top_level = "_cfg_get(draft_hf_config, 'mask_token_id'" in parse
    assert top_level == (tuple(map(int, release.version.split("."))) >= (0, 5, 18))


def _function(module: ast.Module, name: str) -> ast.FunctionDef:
    found = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert found, f"no {name}"
    return found[0]


def test_default_target_layer_ids_are_the_releases_own(release):
    namespace: dict = {"List": list}
    code = ast.Module([_function(tree(release, UTILS), "build_target_layer_ids")], [])
    exec(compile(code, f"sglang {release.version} dflash_utils", "exec"), namespace)
    theirs = namespace["build_target_layer_ids"]
    for target_layers in range(4, 96):
        for draft_layers in range(1, 9):
            ours = default_target_layer_ids(target_layers, draft_layers)
            assert ours == theirs(target_layers, draft_layers), (target_layers, draft_layers)


@pytest.mark.parametrize(
    "rename, problem",
    [
        (("dflash_config", "mask_token_id", "mask_id"), "dflash_config.mask_id: SGLang"),
        ((None, "head_dim", "head_size"), "head_size: SGLang"),
    ],
)
def test_a_renamed_config_key_fails_the_check(exported, rename, problem):
    where, old, new = rename
    config = json.loads(json.dumps(exported[0]))
    section = config[where] if where else config
    section[new] = section.pop(old)
    for version in SUPPORTED_VERSIONS:
        assert any(problem in p for p in config_problems(require(version), config)), version


def test_a_renamed_weight_fails_the_check(exported):
    names = [
        n.replace("q_proj", "query_proj").replace("hidden_norm", "ctx_norm") for n in exported[1]
    ]
    for version in SUPPORTED_VERSIONS:
        problems = "\n".join(weight_problems(require(version), names))
        assert "layers.0.self_attn.query_proj.weight: SGLang" in problems, version
        assert "ctx_norm.weight: SGLang" in problems, version
