"""Tool calls through the engine's HTTP API with the official SDKs, stream and not.

Deterministic answers come from a tiny model taught (in-process, seconds) to answer
the weather question with text and two parallel calls (:mod:`tests.engine.tool_model`);
what a model that has learnt nothing does with a forced call comes from tiny-random.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from reef.core.chat_format import AUTO, TOOL_CALL_OPEN, ToolChoice, call_prefill
from reef.engine.models import load_model
from reef.engine.runtime import Engine
from reef.engine.server import BackgroundServer
from tests.engine.conftest import TINY, Admin
from tests.engine.tool_model import teach_replies
from tests.gateway.harness import GatewayThread, make_settings

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "Weather in Paris and Rome?"}]
CALLS = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
)
REPLY = "Let me check.\n" + CALLS
NAMED = ToolChoice("function", "get_weather")
FORCE_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def taught(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundServer]:
    """An engine whose model answers QUESTION with REPLY (and, forced to call
    get_weather, with CALLS)."""
    engine = Engine(load_model(TINY, tmp_path_factory.mktemp("taught")), threads=1)
    teach_replies(engine, [(QUESTION, [WEATHER], AUTO, REPLY), (QUESTION, [WEATHER], NAMED, CALLS)])
    running = BackgroundServer(engine).start()
    yield running
    running.stop()


@pytest.fixture
async def sdk(taught: BackgroundServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=taught.base_url, api_key="unused", max_retries=0) as c:
        yield c


async def ask(client: openai.AsyncOpenAI, **extra: Any) -> Any:
    body = {"tools": [WEATHER], "temperature": 0, "max_tokens": 200, **extra}
    return await client.chat.completions.create(model=TINY, messages=QUESTION, **body)


def cities(calls: Any) -> list[str]:
    assert all(c.type == "function" and c.function.name == "get_weather" for c in calls)
    return [json.loads(c.function.arguments)["city"] for c in calls]


async def test_generated_calls_come_back_as_tool_calls(sdk: openai.AsyncOpenAI) -> None:
    response = await ask(sdk)
    [choice] = response.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert cities(choice.message.tool_calls) == ["Paris", "Rome"]
    ids = [call.id for call in choice.message.tool_calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2


async def test_streamed_calls_are_tool_call_deltas(sdk: openai.AsyncOpenAI) -> None:
    stream = await ask(sdk, stream=True)
    content, deltas, finishes = "", [], []
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            deltas += choice.delta.tool_calls or []
            finishes.append(choice.finish_reason)
    assert content == "Let me check."
    assert [f for f in finishes if f] == ["tool_calls"]
    # Per call: one delta opening it (id, type, name), then its arguments.
    assert [(d.index, d.id is not None, d.function.name) for d in deltas] == [
        (0, True, "get_weather"),
        (0, False, None),
        (1, True, "get_weather"),
        (1, False, None),
    ]
    assert deltas[0].type == "function" and deltas[0].function.arguments == ""
    assert [json.loads(d.function.arguments)["city"] for d in deltas[1::2]] == ["Paris", "Rome"]


async def test_the_sdk_stream_helper_assembles_the_calls(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.chat.completions.stream(
        model=TINY, messages=QUESTION, tools=[WEATHER], temperature=0, max_tokens=200
    ) as stream:
        final = await stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me check." and cities(message.tool_calls) == ["Paris", "Rome"]


async def test_each_of_n_choices_is_parsed_on_its_own(sdk: openai.AsyncOpenAI) -> None:
    response = await ask(sdk, n=2)
    assert [cities(c.message.tool_calls) for c in response.choices] == [["Paris", "Rome"]] * 2
    ids = {call.id for c in response.choices for call in c.message.tool_calls}
    assert len(ids) == 4
    chunks = [c async for c in await ask(sdk, n=2, stream=True)]
    for index in (0, 1):
        mine = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == index]
        calls = [d for choice in mine for d in choice.delta.tool_calls or []]
        assert [d.index for d in calls] == [0, 0, 1, 1]
        assert [choice.finish_reason for choice in mine if choice.finish_reason] == ["tool_calls"]


async def test_parallel_tool_calls_false_returns_the_first_call_only(
    sdk: openai.AsyncOpenAI,
) -> None:
    """Generation stops at the first call, so fewer tokens are generated (and paid)."""
    both = await ask(sdk)
    response = await ask(sdk, parallel_tool_calls=False)
    assert cities(response.choices[0].message.tool_calls) == ["Paris"]
    assert response.choices[0].finish_reason == "tool_calls"
    assert response.usage.completion_tokens < both.usage.completion_tokens
    chunks = [c async for c in await ask(sdk, parallel_tool_calls=False, stream=True)]
    calls = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert [d.index for d in calls] == [0, 0]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert [f for f in finishes if f] == ["tool_calls"] and finishes[-1] == "tool_calls"
    two = await ask(sdk, parallel_tool_calls=False, n=2)
    assert [cities(c.message.tool_calls) for c in two.choices] == [["Paris"], ["Paris"]]


async def test_a_named_tool_choice_starts_the_reply_with_that_call(
    sdk: openai.AsyncOpenAI,
) -> None:
    for stream in (False, True):
        if stream:
            chunks = [c async for c in await ask(sdk, tool_choice=FORCE_WEATHER, stream=True)]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            calls = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
            assert content == "" and [d.id is not None for d in calls] == [True, False] * 2
            continue
        response = await ask(sdk, tool_choice=FORCE_WEATHER)
        assert response.choices[0].message.content is None
        assert cities(response.choices[0].message.tool_calls) == ["Paris", "Rome"]


async def test_tool_choice_none_offers_no_tools_and_parses_no_calls(
    sdk: openai.AsyncOpenAI,
) -> None:
    with_tools = await ask(sdk, max_tokens=1)
    without = await ask(sdk, tool_choice="none", max_tokens=1)
    plain = await sdk.chat.completions.create(model=TINY, messages=QUESTION, max_tokens=1)
    assert without.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert without.choices[0].message.tool_calls is None


async def test_a_conversation_with_calls_and_results_is_served(
    sdk: openai.AsyncOpenAI, taught: BackgroundServer
) -> None:
    response = await ask(sdk)
    calls = response.choices[0].message.tool_calls
    follow_up = [
        *QUESTION,
        response.choices[0].message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": c.id, "content": "sunny"} for c in calls),
    ]
    answer = await sdk.chat.completions.create(
        model=TINY, messages=follow_up, tools=[WEATHER], max_tokens=3
    )
    assert answer.choices[0].finish_reason in {"stop", "length", "tool_calls"}
    rendered = taught.engine.loaded.tokenizer.decode(
        taught.engine.encode_chat(follow_up, [WEATHER])
    )
    assert rendered.count("<tool_response>\nsunny\n</tool_response>") == 2
    assert CALLS in rendered  # the assistant's calls, in the format it produced them


async def test_a_forced_call_the_model_botches_comes_back_as_text(
    client: openai.AsyncOpenAI,
) -> None:
    """tiny-random has learnt nothing: after the prefill it writes noise, which is no
    call; the reply is that text (prefill included), never an error."""
    for choice in ("required", FORCE_WEATHER):  # required, with one tool, names it
        prefill = call_prefill(NAMED)
        # Greedy: sampled noise could close the call or end early, now and then.
        response = await client.chat.completions.create(
            model=TINY,
            messages=QUESTION,
            tools=[WEATHER],
            tool_choice=choice,
            max_tokens=8,
            temperature=0,
        )
        message = response.choices[0].message
        assert message.tool_calls is None and response.choices[0].finish_reason == "length"
        assert message.content is not None and message.content.startswith(prefill)
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model=TINY,
                messages=QUESTION,
                tools=[WEATHER],
                tool_choice=choice,
                max_tokens=8,
                temperature=0,
                stream=True,
            )
        ]
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed.startswith(TOOL_CALL_OPEN) and streamed.startswith(prefill)
        assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice."),
        ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tools.0"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools.0.function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "tool_calls": [{"function": "get_weather"}]},
                ]
            },
            "tool_calls[0].function.name",
        ),
    ],
)
async def test_bad_tools_and_tool_choice_are_400_naming_the_field(
    admin: Admin, body: dict[str, Any], field: str
) -> None:
    request = {"model": TINY, "messages": QUESTION, "tools": [WEATHER], **body}
    status, text = await admin.post("/chat/completions", request)
    assert status == 400, text
    error = json.loads(text)["error"]
    assert error["type"] == "invalid_request_error" and field in error["message"], error


@pytest.fixture(scope="module")
def gateway(taught: BackgroundServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway whose scenario ``tiny`` is served by the taught engine."""
    tmp_path: Path = tmp_path_factory.mktemp("gateway")
    settings = make_settings(
        tmp_path,
        taught.base_url,
        upstreams={"engine": {"type": "openai", "base_url": taught.base_url, "model": TINY}},
        scenarios={"tiny": {"upstream": "engine"}},
    )
    with GatewayThread(settings) as running:
        yield running


ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": WEATHER["function"]["parameters"],
}


def test_anthropic_messages_get_tool_use_blocks(gateway: GatewayThread) -> None:
    message = gateway.anthropic().messages.create(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        max_tokens=200,
        extra_body={"temperature": 0},  # this SDK has no temperature argument
    )
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert message.content[0].text == "Let me check."  # type: ignore[union-attr]
    assert [b.input for b in message.content[1:]] == [{"city": "Paris"}, {"city": "Rome"}]  # type: ignore[union-attr]
    assert all(b.name == "get_weather" for b in message.content[1:])  # type: ignore[union-attr]


def test_anthropic_streams_get_tool_use_blocks(gateway: GatewayThread) -> None:
    with gateway.anthropic().messages.stream(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        max_tokens=200,
        extra_body={"temperature": 0},
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["text", "tool_use", "tool_use"]
    assert [b.input for b in message.content[1:]] == [{"city": "Paris"}, {"city": "Rome"}]  # type: ignore[union-attr]


def test_anthropic_tool_choice_reaches_the_engine(gateway: GatewayThread) -> None:
    """``{"type": "tool"}`` is a named choice (the call comes first, no text);
    ``{"type": "none"}`` offers no tools and reads no calls: the answer is text."""
    client = gateway.anthropic()
    forced = client.messages.create(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=200,
        extra_body={"temperature": 0},
    )
    assert forced.stop_reason == "tool_use"
    assert [b.input for b in forced.content] == [{"city": "Paris"}, {"city": "Rome"}]  # type: ignore[union-attr]
    plain = client.messages.create(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        tool_choice={"type": "none"},
        max_tokens=4,
        extra_body={"temperature": 0},
    )
    assert [b.type for b in plain.content] == ["text"] and plain.stop_reason != "tool_use"


def test_an_anthropic_tool_result_turn_is_served(gateway: GatewayThread) -> None:
    client = gateway.anthropic()
    first = client.messages.create(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        max_tokens=200,
        extra_body={"temperature": 0},
    )
    results = [
        {"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}  # type: ignore[union-attr]
        for block in first.content
        if block.type == "tool_use"
    ]
    second = client.messages.create(
        model="reef/tiny",
        messages=[
            *QUESTION,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": results},
        ],  # type: ignore[arg-type]
        tools=[ANTHROPIC_TOOL],  # type: ignore[list-item]
        max_tokens=4,
    )
    assert second.role == "assistant" and second.usage.input_tokens > first.usage.input_tokens


def test_openai_through_the_gateway_gets_tool_calls(gateway: GatewayThread) -> None:
    response = gateway.openai().chat.completions.create(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=200,
        temperature=0,
    )
    assert response.choices[0].finish_reason == "tool_calls"
    assert cities(response.choices[0].message.tool_calls) == ["Paris", "Rome"]


def test_a_streamed_call_is_recorded_as_tool_calls(gateway: GatewayThread) -> None:
    """What learning reads: the gateway's record of a stream carries the engine's calls."""
    with gateway.openai().chat.completions.with_streaming_response.create(
        model="reef/tiny",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=FORCE_WEATHER,  # type: ignore[arg-type]
        max_tokens=200,
        temperature=0,
        stream=True,
    ) as response:
        record_id = response.headers["x-reef-record-id"]
        assert len([chunk for chunk in response.parse()]) > 2
    record = gateway.store.get_record(record_id)
    assert record.status == "ok" and record.response is not None
    [choice] = record.response["choices"]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == ["Paris", "Rome"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2


def test_responses_through_the_gateway_get_function_call_items(gateway: GatewayThread) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        **{k: v for k, v in WEATHER["function"].items() if k != "name"},
    }
    response = gateway.openai().responses.create(
        model="reef/tiny",
        input="Weather in Paris and Rome?",
        tools=[tool],  # type: ignore[list-item]
        max_output_tokens=200,
        temperature=0,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [json.loads(c.arguments)["city"] for c in calls] == ["Paris", "Rome"]  # type: ignore[union-attr]
    assert all(c.name == "get_weather" and c.call_id.startswith("call_") for c in calls)  # type: ignore[union-attr]
