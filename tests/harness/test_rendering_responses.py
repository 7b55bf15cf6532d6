"""Rendering a harness into an OpenAI Responses request (the native passthrough)."""

from __future__ import annotations

import copy
from typing import Any

from reef.harness import Harness, render_responses
from reef.harness.rendering_responses import responses_tool_choice


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "reef/travel",
        "instructions": "Client instructions.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Rain in Paris?"}]},
        ],
        **extra,
    }


def test_system_text_goes_before_the_clients_instructions(harness: Harness) -> None:
    out = render_responses(harness, _body())
    assert out["instructions"].startswith("You are a travel assistant.\n\n## Rules\n")
    assert "## Skill: weather-lookup" in out["instructions"]  # "rain" in the input parts
    assert out["instructions"].endswith("- The user prefers Celsius.\n\nClient instructions.")


def test_examples_are_items_before_the_conversation(harness: Harness) -> None:
    out = render_responses(harness, {"input": "Rain in Paris?"})
    assert out["instructions"].endswith("- The user prefers Celsius.")
    assert out["input"] == [
        {"type": "message", "role": "user", "content": "Weather in Rome?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Rome"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": "Sunny in Rome."},
        {"type": "message", "role": "user", "content": "Rain in Paris?"},
    ]


def test_tools_params_and_tool_choice(harness: Harness) -> None:
    out = render_responses(harness, _body(max_output_tokens=5, temperature=1.0))
    assert out["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    assert out["max_output_tokens"] == 256  # enforced
    assert out["temperature"] == 1.0 and out["top_p"] == 0.9  # defaults only
    assert "stop" not in out and "max_tokens" not in out  # no Responses counterpart
    assert out["tool_choice"] == "auto"
    own = {"type": "function", "name": "get_weather", "description": "mine"}
    assert render_responses(harness, _body(tools=[own]))["tools"] == [own]  # client wins
    named = {"type": "function", "function": {"name": "f"}}
    assert responses_tool_choice(named) == {"type": "function", "name": "f"}


def test_the_body_is_not_changed(harness: Harness) -> None:
    body = _body(tools=[{"type": "function", "name": "x"}])
    kept = copy.deepcopy(body)
    render_responses(harness, body)
    assert body == kept
    empty = Harness(schema_version=1)
    assert render_responses(empty, body) == body
