"""The tool format on its own: rendering conversations with tools, parsing replies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reef.core.chat_format import (
    AUTO,
    TOOL_PROMPT_HEAD,
    ToolCall,
    ToolCallStream,
    ToolChoice,
    assistant_text,
    call_prefill,
    format_tool_call,
    parse_tool_calls,
    render_tools,
    template_takes_tools,
    tool_prompt,
)
from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.tiny import CHAT_TEMPLATE

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
NAMES = frozenset({"get_weather"})

# SmolLM2-135M-Instruct's template, as its GGUF carries it: no ``tools``.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
    "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# A Hermes/Qwen-style template that takes ``tools`` and renders calls itself.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS{% for t in tools %} {{ t.function.name }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}CALL {{ c.function.name }} "
    "{{ c.function.arguments.city }}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CALL_ROME = CALL.replace("Paris", "Rome")

CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
]


def test_which_templates_take_tools() -> None:
    assert not template_takes_tools(SMOLLM2_TEMPLATE)
    assert not template_takes_tools(CHAT_TEMPLATE)
    assert template_takes_tools(TOOLS_TEMPLATE)
    assert not template_takes_tools(None)


def test_the_default_prompt_lists_each_tool_and_the_call_format() -> None:
    prompt = tool_prompt([WEATHER])
    assert prompt.startswith(TOOL_PROMPT_HEAD)
    line = prompt.split("<tools>\n")[1].split("\n")[0]
    assert json.loads(line) == WEATHER
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}' in prompt
    assert "must" not in prompt
    assert tool_prompt([WEATHER], ToolChoice("required")).endswith("call at least one function.")
    named = tool_prompt([WEATHER], ToolChoice("function", "get_weather"))
    assert named.endswith("You must call the function get_weather.")


def test_a_template_without_tools_gets_them_in_the_system_message() -> None:
    rendered = render_tools(CONVERSATION, [WEATHER], template_takes_tools=False)
    assert rendered.template_tools is None and rendered.prefill == ""
    assert [m["role"] for m in rendered.messages] == ["system", "user", "assistant", "user"]
    assert rendered.messages[0]["content"] == tool_prompt([WEATHER])
    assert rendered.messages[2]["content"] == CALL + "\n" + CALL_ROME
    assert "tool_calls" not in rendered.messages[2]
    assert rendered.messages[3]["content"] == (
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response>"
    )


def test_the_tool_prompt_joins_an_existing_system_message_and_text_precedes_calls() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            **CONVERSATION[1],
            "content": "Checking.",
            "tool_calls": CONVERSATION[1]["tool_calls"][:1],
        },
    ]
    rendered = render_tools(messages, [WEATHER], template_takes_tools=False)
    assert rendered.messages[0]["content"] == "Be brief.\n\n" + tool_prompt([WEATHER])
    assert rendered.messages[1]["content"] == "Checking.\n" + CALL


def test_tool_choice_none_renders_no_tools_but_keeps_the_history() -> None:
    rendered = render_tools(CONVERSATION, [WEATHER], ToolChoice("none"), template_takes_tools=False)
    assert [m["role"] for m in rendered.messages] == ["user", "assistant", "user"]
    assert rendered.messages[1]["content"] == CALL + "\n" + CALL_ROME
    assert rendered.prefill == ""


def test_forced_calls_prefill_the_reply() -> None:
    named = ToolChoice("function", "get_weather")
    assert call_prefill(named) == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert CALL.startswith(call_prefill(named))
    assert CALL.startswith(call_prefill(ToolChoice("required")))
    assert call_prefill(AUTO) == call_prefill(ToolChoice("none")) == ""
    assert render_tools(CONVERSATION[:1], [WEATHER], named, template_takes_tools=False).prefill


def test_required_with_one_tool_names_it() -> None:
    other = {"type": "function", "function": {"name": "lookup_order"}}
    required = ToolChoice("required")
    one = render_tools(CONVERSATION[:1], [WEATHER], required, template_takes_tools=False)
    assert one.prefill == call_prefill(ToolChoice("function", "get_weather"))
    assert one.messages[0]["content"].endswith("You must call the function get_weather.")
    two = render_tools(CONVERSATION[:1], [WEATHER, other], required, template_takes_tools=False)
    assert two.prefill == call_prefill(required)


def test_a_template_that_takes_tools_gets_them_and_argument_objects() -> None:
    rendered = render_tools(CONVERSATION, [WEATHER], template_takes_tools=True)
    assert rendered.template_tools == [WEATHER]
    assert [m["role"] for m in rendered.messages] == ["user", "assistant", "tool", "tool"]
    arguments = [c["function"]["arguments"] for c in rendered.messages[1]["tool_calls"]]
    assert arguments == [{"city": "Paris"}, {"city": "Rome"}]
    assert CONVERSATION[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def _engine(tmp_path: Path, template: str) -> Engine:
    loaded = load_model("tiny-random", tmp_path)
    loaded.tokenizer.chat_template = template
    return Engine(loaded, threads=1)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, SMOLLM2_TEMPLATE])
def test_the_engine_renders_tools_for_a_template_without_them(
    tmp_path: Path, template: str
) -> None:
    engine = _engine(tmp_path, template)
    ids, prefill = engine.encode_tool_chat(CONVERSATION, [WEATHER], AUTO)
    text = engine.loaded.tokenizer.decode(ids)
    assert prefill == ""
    assert TOOL_PROMPT_HEAD in text and '"name": "get_weather"' in text
    assert CALL in text and "<tool_response>\nrain\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_the_engine_passes_tools_to_a_template_that_takes_them(tmp_path: Path) -> None:
    engine = _engine(tmp_path, TOOLS_TEMPLATE)
    ids, prefill = engine.encode_tool_chat(CONVERSATION, [WEATHER], ToolChoice("required"))
    text = engine.loaded.tokenizer.decode(ids)
    assert "TOOLS get_weather" in text and TOOL_PROMPT_HEAD not in text
    assert "CALL get_weather Paris" in text  # the arguments reached it as an object
    assert text.endswith("<|im_start|>assistant\n" + prefill) and prefill


def test_one_call() -> None:
    reply = parse_tool_calls(CALL, NAMES)
    assert reply.content == ""
    [call] = reply.calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_") and len(call.id) > 10
    assert call.to_openai() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": call.arguments},
    }


def test_parallel_calls_and_text_before_them() -> None:
    reply = parse_tool_calls(f"Let me check.\n{CALL}\n{CALL_ROME}\n", NAMES)
    assert reply.content == "Let me check."
    assert [json.loads(c.arguments)["city"] for c in reply.calls] == ["Paris", "Rome"]
    assert len({c.id for c in reply.calls}) == 2


def test_text_after_a_call_is_content() -> None:
    reply = parse_tool_calls(f"Checking.\n{CALL}\nDone.", NAMES)
    assert reply.content == "Checking.\nDone."
    assert len(reply.calls) == 1


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',  # bad JSON
        '<tool_call>\n["get_weather"]\n</tool_call>',  # no object
        '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
        '<tool_call>\n{"name": "get_weather", "arguments": "Paris"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": 5}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": true}\n</tool_call>',
        '<tool_call>\n{"name": 7, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {}} trailing\n</tool_call>',
        '<tool_call>\n{"name": "launch_rockets", "arguments": {}}\n</tool_call>',  # not offered
        '<tool_call>\n{"name": "get_weather", "arguments": {"ci',  # cut off
        "hello <tool_call",
    ],
)
def test_what_is_no_call_stays_text(text: str) -> None:
    assert parse_tool_calls(text, NAMES).content == text
    assert parse_tool_calls(text, NAMES).calls == ()


def test_a_bad_block_stays_text_beside_a_good_call() -> None:
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    reply = parse_tool_calls(f"{bad}\n{CALL}", NAMES)
    assert reply.content == bad
    assert [c.name for c in reply.calls] == ["get_weather"]


def test_null_arguments_and_arguments_as_json_text_are_objects() -> None:
    for arguments in ("null", '"{\\"city\\": \\"Paris\\"}"'):
        text = f'<tool_call>{{"name": "get_weather", "arguments": {arguments}}}</tool_call>'
        [call] = parse_tool_calls(text, NAMES).calls
        assert json.loads(call.arguments) in ({}, {"city": "Paris"})


def test_a_complete_call_cut_before_its_closing_tag_counts() -> None:
    reply = parse_tool_calls(CALL.removesuffix("</tool_call>"), NAMES)
    assert [c.name for c in reply.calls] == ["get_weather"]


def test_a_reply_without_calls_is_unchanged() -> None:
    for text in ("  Paris is sunny.\n\n", "a < b and <tool> tags", ""):
        assert parse_tool_calls(text, NAMES).content == text


def test_any_name_is_a_call_when_no_names_are_given() -> None:
    assert parse_tool_calls(CALL.replace("get_weather", "other")).calls[0].name == "other"


def test_format_tool_call_is_what_the_parser_reads() -> None:
    assert format_tool_call("get_weather", {"city": "Paris"}) == CALL
    assert format_tool_call("get_weather", '{"city": "Paris"}') == CALL
    [call] = parse_tool_calls(format_tool_call("get_weather", {"q": "é"})).calls
    assert json.loads(call.arguments) == {"q": "é"}


STREAMED = [
    f"Let me check.\n{CALL}\n{CALL_ROME}",
    f"{CALL}\nDone.  ",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call> after',
    "plain text with a < sign\n",
    CALL.removesuffix("\n</tool_call>"),
]


@pytest.mark.parametrize("text", STREAMED)
def test_streaming_any_split_gives_the_parse_of_the_whole(text: str) -> None:
    whole = parse_tool_calls(text, NAMES)
    for size in (1, 2, 5):
        stream = ToolCallStream(NAMES)
        pieces = []
        for start in range(0, len(text), size):
            pieces += stream.feed(text[start : start + size])
        pieces += stream.finish()
        content = "".join(p for p in pieces if isinstance(p, str))
        calls = [(c.name, c.arguments) for c in pieces if not isinstance(c, str)]
        assert content == whole.content
        assert calls == [(c.name, c.arguments) for c in whole.calls]


def test_text_streams_before_a_call_and_a_call_comes_out_once_closed() -> None:
    stream = ToolCallStream(NAMES)
    assert stream.feed("Let me check.") == ["Let me check."]
    assert stream.feed("\n<tool") == []  # could be a call's opening: held back
    assert stream.feed('_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}') == []
    [call] = stream.feed("\n</tool_call>")
    assert not isinstance(call, str) and call.name == "get_weather"
    assert stream.finish() == []


def test_without_parallel_calls_the_first_call_ends_the_reply() -> None:
    text = f"Checking.\n{CALL}\n{CALL_ROME}\nDone."
    reply = parse_tool_calls(text, NAMES, parallel=False)
    assert reply.content == "Checking."
    assert [json.loads(c.arguments)["city"] for c in reply.calls] == ["Paris"]
    stream = ToolCallStream(NAMES, parallel=False)
    pieces = [p for i in range(0, len(text), 3) for p in stream.feed(text[i : i + 3])]
    assert len([p for p in [*pieces, *stream.finish()] if not isinstance(p, str)]) == 1


def test_an_assistant_turn_as_text_parses_back_to_its_calls() -> None:
    text = assistant_text({**CONVERSATION[1], "content": "Checking."})
    assert text == f"Checking.\n{CALL}\n{CALL_ROME}"
    reply = parse_tool_calls(text, NAMES)
    assert reply.content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in reply.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert all(isinstance(c, ToolCall) for c in reply.calls)
    assert assistant_text({"role": "assistant", "content": "hi"}) == "hi"
