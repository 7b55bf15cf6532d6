from __future__ import annotations

from typing import Any

import pytest

from reef.harness import Bundle, Example, Harness, Orchestration, Skill

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture
def harness() -> Harness:
    return Harness(
        schema_version=1,
        system_prompt="You are a travel assistant.",
        instructions=["Answer in one sentence.", "Never invent prices."],
        examples=[
            Example(
                messages=[
                    {"role": "user", "content": "Weather in Rome?"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Rome"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                    {"role": "assistant", "content": "Sunny in Rome."},
                ],
                tags=["tools"],
            )
        ],
        skills=[
            Skill(
                name="weather-lookup",
                description="Looking up forecasts.",
                when_to_use="Questions about rain, forecast or temperature.",
                content="Call get_weather before answering.",
            ),
            Skill(name="booking", when_to_use="flights hotels reservations", content="Ask dates."),
            Skill(name="visa", when_to_use="passport requirements", content="Check embassy."),
        ],
        memory=["The user prefers Celsius."],
        tools=[WEATHER_TOOL],
        params={"temperature": 0.2, "max_tokens": 256, "top_p": 0.9, "stop": ["END"]},
        enforced_params=["max_tokens"],
        orchestration=Orchestration(max_turns=8, tool_choice="auto", extra={"planner": "react"}),
    )


@pytest.fixture
def bundle(harness: Harness) -> Bundle:
    return Bundle(
        harness,
        {
            "skills/weather.md": b"# Weather\nUse the tool.\n",
            "files/data/cities.csv": b"name\nRome\nParis\n",
            "README.md": "caf\u00e9".encode(),
        },
    )
