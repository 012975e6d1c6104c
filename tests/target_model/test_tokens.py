import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from stages.target_model.tokens import analyze_output, learn_roles

SPECIAL = [
    "[UNK]",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "[EOS]",
]
WORDS = ["hello", "world", "call", "f", "{}", "answer"]


@pytest.fixture(scope="module")
def tok():
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=inner,
        unk_token="[UNK]",
        eos_token="[EOS]",
        additional_special_tokens=SPECIAL[1:-1],
    )


def ids(tok, *tokens):
    return [tok.convert_tokens_to_ids(t) for t in tokens]


def test_roles_are_learned_by_string(tok):
    roles = learn_roles(tok)
    assert roles.think == tok.convert_tokens_to_ids("<think>")
    assert roles.end_think == tok.convert_tokens_to_ids("</think>")
    assert roles.tool_call_begin == tok.convert_tokens_to_ids("<|tool_call_begin|>")
    assert roles.end_of_turn == tok.convert_tokens_to_ids("<|im_end|>")
    assert roles.stop_ids == sorted({roles.end_of_turn, tok.eos_token_id})


def test_role_overrides(tok):
    roles = learn_roles(tok, {"end_of_turn": "[EOS]", "think": None})
    assert roles.end_of_turn == tok.eos_token_id and roles.think is None
    with pytest.raises(ValueError, match="roles.end_think: 'nope' is not a single token"):
        learn_roles(tok, {"end_think": "nope"})
    with pytest.raises(ValueError, match="unknown role"):
        learn_roles(tok, {"thinking": "<think>"})


def test_reasoning_then_tool_call(tok):
    roles = learn_roles(tok)
    out = ids(
        tok,
        "hello",
        "world",
        "</think>",
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        "f",
        "<|tool_call_argument_begin|>",
        "{}",
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
        "<|im_end|>",
    )
    a = analyze_output(out, roles, reasoning_open=True)
    assert a.reasoning_tokens == 2
    assert a.answer_tokens == 7  # everything after </think>, stop token excluded
    assert a.tool_calls == 1 and a.tool_calls_balanced


def test_reasoning_never_closed_and_lost_reasoning(tok):
    roles = learn_roles(tok)
    unclosed = analyze_output(ids(tok, "hello", "world"), roles, reasoning_open=True)
    assert unclosed.reasoning_tokens is None and unclosed.answer_tokens == 0
    # the seeds' bug: reasoning stripped, only the answer left; nothing closes reasoning
    stripped = analyze_output(ids(tok, "answer", "<|im_end|>"), roles, reasoning_open=True)
    assert stripped.reasoning_tokens is None
    # a model that emits the think token itself (no think in the prompt)
    emitted = analyze_output(ids(tok, "<think>", "hello", "</think>", "answer"), roles, False)
    assert emitted.reasoning_tokens == 2 and emitted.answer_tokens == 1
    plain = analyze_output(ids(tok, "answer", "world"), roles, reasoning_open=False)
    assert plain.reasoning_tokens is None and plain.answer_tokens == 2


def test_unbalanced_tool_calls(tok):
    roles = learn_roles(tok)
    cut = ids(tok, "</think>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "f")
    a = analyze_output(cut, roles, reasoning_open=True)
    assert a.tool_calls == 0 and not a.tool_calls_balanced
    stray = ids(tok, "</think>", "<|tool_call_end|>", "<|im_end|>")
    assert not analyze_output(stray, roles, reasoning_open=True).tool_calls_balanced
    two = ids(
        tok,
        "</think>",
        "<|tool_calls_section_begin|>",
        "<|tool_call_begin|>",
        "<|tool_call_end|>",
        "<|tool_call_begin|>",
        "<|tool_call_end|>",
        "<|tool_calls_section_end|>",
    )
    b = analyze_output(two, roles, reasoning_open=True)
    assert b.tool_calls == 2 and b.tool_calls_balanced
