"""Which assistant turns the target rewrites with regenerate: all_turns, and what stays source."""

import pytest

from stages.sources import prompt_messages, turn_bounds


def user(text):
    return {"role": "user", "content": text}


def reply(text, *calls):
    message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {
                "id": f"functions.{c}:0",
                "type": "function",
                "function": {"name": c, "arguments": "{}"},
            }
            for c in calls
        ]
    return message


def result(call):
    return {"role": "tool", "content": "42", "tool_call_id": f"functions.{call}:0", "name": call}


UNWRITTEN = {"role": "assistant", "content": None}
SYSTEM = {"role": "system", "content": "Be brief."}


def prompts(messages):
    """Each rewritten turn's new messages, as the template will see them."""
    return [messages[start:end] for start, end in turn_bounds(messages)]


def test_every_turn_after_a_user_message_is_rewritten_and_the_last_reply_dropped():
    messages = [SYSTEM, user("a"), reply("A"), user("b"), reply("B1"), reply("B2"), user("c")]
    assert prompts(messages) == [[SYSTEM, user("a")], [user("b")], [user("c")]]
    assert prompts(messages[:-1]) == [[SYSTEM, user("a")], [user("b")]]  # B1+B2 is one turn


def test_a_turn_whose_call_a_tool_result_answers_stays_as_the_source_has_it():
    messages = [
        SYSTEM,
        user("weather?"),
        reply("", "weather"),
        result("weather"),
        reply("Sunny."),
        user("and tomorrow?"),
        reply("", "forecast"),
        result("forecast"),
        reply("Rain."),
    ]
    assert prompts(messages) == [messages[:4], messages[5:8]]
    assert turn_bounds(messages)[-1][1] == len(prompt_messages(messages))  # as last_turn's


def test_a_call_no_result_answers_is_rewritten():
    messages = [user("weather?"), reply("", "weather"), user("never mind")]
    assert prompts(messages) == [[user("weather?")], [user("never mind")]]


def test_replies_the_source_lacks_are_written_by_the_target():
    messages = [user("Write a poem."), UNWRITTEN, user("Now shorter.")]
    assert prompts(messages) == [[user("Write a poem.")], [user("Now shorter.")]]
    assert prompt_messages(messages) == [user("Write a poem.")]  # last_turn: the first question


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([SYSTEM, UNWRITTEN, user("a")], "message 1 is a reply left to the target"),
        ([user("a"), UNWRITTEN, result("f"), user("b")], "message 1 is a reply left to the target"),
        ([SYSTEM, reply("hello")], "no user turn or tool result"),
    ],
)
def test_conversations_without_a_turn_to_write(messages, fragment):
    with pytest.raises(ValueError, match=fragment):
        turn_bounds(messages)
