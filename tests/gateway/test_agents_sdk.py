"""The OpenAI Agents SDK through Reef: an agent with a function tool, on the SDK's default
model class (``OpenAIResponsesModel``, the Responses API), in front of the fake
chat-completions upstream. Its tool loop is recorded as one session.

The agent names its scenario by a model alias: the SDK's default provider reads
``x/y`` as provider/model and refuses ``reef/support`` itself."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    RunConfig,
    Runner,
    UserError,
    function_tool,
    set_tracing_disabled,
)
from agents.models.multi_provider import MultiProvider
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

from reef.experience import RecordFilter, RecordView
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings


@function_tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    """The SDK exports traces to OpenAI unless told not to: nothing leaves the machine."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@pytest.fixture
def gateway(tmp_path: Path, fake: FakeUpstreamThread) -> Iterator[GatewayThread]:
    scenarios = {"support": {"upstream": "fake", "model_aliases": ["support-agent"]}}
    with GatewayThread(make_settings(tmp_path, fake.base_url, scenarios=scenarios)) as gw:
        yield gw


def _run(gateway: GatewayThread, model: str, text: str, stream: bool) -> Any:
    """Run the weather agent once on ``text`` through the gateway; its final output."""

    async def run() -> Any:
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="none", max_retries=0
        ) as client:
            provider = MultiProvider(openai_client=client)
            assert isinstance(provider.get_model(model), OpenAIResponsesModel)
            agent = Agent(
                name="weather", instructions="Use the tool.", tools=[get_weather], model=model
            )
            config = RunConfig(model_provider=provider, tracing_disabled=True)
            if not stream:
                return (await Runner.run(agent, text, run_config=config)).final_output
            streamed = Runner.run_streamed(agent, text, run_config=config)
            async for _ in streamed.stream_events():
                pass
            return streamed.final_output

    return asyncio.run(run())


def _records(gateway: GatewayThread) -> list[RecordView]:
    page = gateway.store.list_records("support", RecordFilter(), None, 50)
    return sorted(page.records, key=lambda record: record.turn)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_agent_tool_loop_is_recorded_as_one_session(
    gateway: GatewayThread, fake: FakeUpstreamThread, stream: bool
) -> None:
    final = _run(gateway, "support-agent", "What is the weather in Paris?", stream)
    assert final == "tool said: sunny in Paris"
    call, answer = _records(gateway)
    assert {call.api, answer.api} == {"openai.responses"}
    assert {call.status, answer.status} == {"ok"}
    assert call.session_id == answer.session_id and (call.turn, answer.turn) == (0, 1)
    # first turn: the model asked for the tool
    assert call.request["model"] == "support-agent" and call.request["tools"][0]["name"] == (
        "get_weather"
    )
    assert call.response is not None
    (function_call,) = call.response["output"]
    assert function_call["type"] == "function_call" and function_call["name"] == "get_weather"
    assert function_call["arguments"] == '{"city": "Paris"}'
    # second turn: the tool's output went back, the final text came out
    kinds = [item.get("type", "message") for item in answer.request["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]
    output = answer.request["input"][2]
    assert output["call_id"] == function_call["call_id"] and output["output"] == "sunny in Paris"
    assert answer.response is not None
    (message,) = answer.response["output"]
    assert message["type"] == "message"
    assert message["content"][0]["text"] == "tool said: sunny in Paris"
    # the upstream was asked in chat completions, with the tool result as a tool message
    assert fake.last_request_body["messages"][-1] == {
        "role": "tool",
        "tool_call_id": function_call["call_id"],
        "content": "sunny in Paris",
    }


def test_the_sdk_refuses_reef_names_but_passes_aliases_and_openai_prefixed_ones(
    gateway: GatewayThread,
) -> None:
    """Why aliases exist: ``reef/support`` fails in the SDK before any request. An
    alias, or ``openai/reef/support`` (the SDK strips ``openai/``), reaches the scenario."""
    with pytest.raises(UserError, match="Unknown prefix: reef"):
        MultiProvider().get_model("reef/support")
    assert _run(gateway, "openai/reef/support", "hello", stream=False) == "echo: hello"
    (record,) = _records(gateway)
    assert record.request["model"] == "reef/support"
