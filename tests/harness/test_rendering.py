"""Rendering a harness into OpenAI and Anthropic requests."""

from __future__ import annotations

import copy
from typing import Any

from reef.harness import Harness, Skill, relevant_skills, render_anthropic, render_openai

CLIENT_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "client's own", "parameters": {}},
}


def _openai_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "reef/travel",
        "messages": [
            {"role": "system", "content": "Client system."},
            {"role": "user", "content": "Will it rain in Paris tomorrow?"},
        ],
        **extra,
    }


def test_system_text_goes_before_the_clients(harness: Harness) -> None:
    system = render_openai(harness, _openai_body())["messages"][0]
    assert system["role"] == "system"
    assert system["content"] == (
        "You are a travel assistant.\n\n"
        "## Rules\n- Answer in one sentence.\n- Never invent prices.\n\n"
        "## Skill: weather-lookup\nLooking up forecasts.\nCall get_weather before answering.\n\n"
        "## Memory\n- The user prefers Celsius.\n\n"
        "Client system."
    )


def test_system_message_added_when_the_client_has_none(harness: Harness) -> None:
    body = {"messages": [{"role": "user", "content": "hello"}]}
    messages = render_openai(harness, body)["messages"]
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("You are a travel assistant.")
    assert "## Skill" not in messages[0]["content"]
    assert messages[-1] == {"role": "user", "content": "hello"}


def test_client_system_parts_are_kept(harness: Harness) -> None:
    parts = [{"type": "text", "text": "Client part."}]
    body = {"messages": [{"role": "developer", "content": parts}, {"role": "user", "content": "x"}]}
    first = render_openai(harness, body)["messages"][0]
    assert first["role"] == "developer"
    assert first["content"][1:] == parts
    assert first["content"][0]["text"].startswith("You are a travel assistant.")


def test_examples_become_prior_turns_after_the_system_message(harness: Harness) -> None:
    messages = render_openai(harness, _openai_body())["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert messages[1] == {"role": "user", "content": "Weather in Rome?"}
    assert messages[-1]["content"] == "Will it rain in Paris tomorrow?"


def test_client_tool_of_the_same_name_wins(harness: Harness) -> None:
    extra_tool = {"type": "function", "function": {"name": "book", "parameters": {}}}
    more = harness.model_copy(update={"tools": [*harness.tools, extra_tool]})
    tools = render_openai(more, _openai_body(tools=[CLIENT_TOOL]))["tools"]
    assert tools == [CLIENT_TOOL, extra_tool]
    assert render_openai(more, _openai_body())["tools"] == more.tools


def test_params_are_defaults_unless_enforced(harness: Harness) -> None:
    out = render_openai(harness, _openai_body(temperature=1.0, max_tokens=4000))
    assert out["temperature"] == 1.0  # the client's value wins
    assert out["max_tokens"] == 256  # enforced
    assert out["top_p"] == 0.9 and out["stop"] == ["END"]  # defaults fill gaps
    aliased = render_openai(harness, _openai_body(max_completion_tokens=9))
    assert aliased["max_completion_tokens"] == 256 and "max_tokens" not in aliased
    relaxed = harness.model_copy(update={"enforced_params": []})
    assert render_openai(relaxed, _openai_body(max_tokens=4000))["max_tokens"] == 4000
    assert render_openai(relaxed, _openai_body(temperature=None))["temperature"] == 0.2


def test_tool_choice_is_a_default(harness: Harness) -> None:
    assert render_openai(harness, _openai_body())["tool_choice"] == "auto"
    assert render_openai(harness, _openai_body(tool_choice="none"))["tool_choice"] == "none"
    no_tools = harness.model_copy(update={"tools": []})
    assert "tool_choice" not in render_openai(no_tools, _openai_body())


def test_input_is_never_mutated(harness: Harness) -> None:
    book = {"type": "function", "function": {"name": "book", "parameters": {}}}
    body = _openai_body(tools=[book], temperature=1.0)
    before = copy.deepcopy(body)
    frozen_harness = harness.model_dump()
    out = render_openai(harness, body)
    out["messages"][1]["content"] = "changed"
    out["tools"][1]["function"]["name"] = "changed"
    assert body == before
    assert harness.model_dump() == frozen_harness


def test_empty_harness_changes_nothing() -> None:
    empty = Harness(schema_version=1)
    body = _openai_body()
    assert render_openai(empty, body) == body
    anthropic_body = {"system": "s", "messages": [{"role": "user", "content": "x"}]}
    assert render_anthropic(empty, anthropic_body) == anthropic_body


def test_skill_relevance_rule(harness: Harness) -> None:
    def names(text: str, limit: int = 3) -> list[str]:
        return [skill.name for skill in relevant_skills(harness, text, limit)]

    assert names("Will it RAIN?") == ["weather-lookup"]
    assert names("need a hotel and my passport") == ["booking", "visa"]
    assert names("the user asks about when to use this") == []  # stop words only
    assert names("rainy") == []  # whole words only
    assert names("weather forecast, hotel, passport", limit=1) == ["weather-lookup"]
    many = [Skill(name=f"s{i}", when_to_use="python", content="c") for i in range(5)]
    crowded = harness.model_copy(update={"skills": many})
    assert len(relevant_skills(crowded, "python please")) == 3


def test_skills_follow_the_last_user_message(harness: Harness) -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Is it going to rain?"},
            {"role": "assistant", "content": "Let me check."},
            {"role": "user", "content": [{"type": "text", "text": "Book a hotel instead"}]},
        ]
    }
    system = render_openai(harness, body)["messages"][0]["content"]
    assert "## Skill: booking" in system and "weather-lookup" not in system


def test_anthropic_shape(harness: Harness) -> None:
    body: dict[str, Any] = {
        "model": "reef/travel",
        "system": "Client system.",
        "max_tokens": 1000,
        "temperature": 0.7,
        "messages": [{"role": "user", "content": "Rain in Oslo?"}],
        "tools": [{"name": "book", "description": "client", "input_schema": {"type": "object"}}],
    }
    out = render_anthropic(harness, body)
    assert out["system"].startswith("You are a travel assistant.")
    assert out["system"].endswith("\n\nClient system.")
    assert "## Skill: weather-lookup" in out["system"]
    assert out["max_tokens"] == 256  # enforced
    assert out["temperature"] == 0.7  # the client's
    assert out["top_p"] == 0.9
    assert out["stop_sequences"] == ["END"] and "stop" not in out
    assert out["tools"] == [
        body["tools"][0],
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    ]
    assert out["tool_choice"] == {"type": "auto"}
    assert out["messages"] == [
        {"role": "user", "content": "Weather in Rome?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                }
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}],
        },
        {"role": "assistant", "content": "Sunny in Rome."},
        {"role": "user", "content": "Rain in Oslo?"},
    ]


def test_anthropic_system_blocks_and_tool_choice(harness: Harness) -> None:
    blocks = [{"type": "text", "text": "Client block.", "cache_control": {"type": "ephemeral"}}]
    body = {"system": blocks, "messages": [{"role": "user", "content": "hi"}]}
    forced = harness.model_copy(
        update={
            "orchestration": harness.orchestration.model_copy(
                update={"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
            )
        }
    )
    out = render_anthropic(forced, body)
    assert out["system"][1:] == blocks and out["system"][0]["type"] == "text"
    assert out["tool_choice"] == {"type": "tool", "name": "get_weather"}
    client_tool = {"name": "get_weather", "input_schema": {"type": "object"}}
    assert render_anthropic(harness, {**body, "tools": [client_tool]})["tools"] == [client_tool]
