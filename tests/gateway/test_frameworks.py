"""LangChain (``langchain-openai``) and pydantic-ai through Reef, configured as
docs/getting-started.md shows: only the base URL changes. Each framework's chat model
and its Responses model, plain and in a tool loop, in front of the fake chat-completions
upstream (which calls the weather tool when asked about the weather); every call is
recorded, and a tool loop is one session."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from reef.experience import RecordFilter, RecordView
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

API = {False: "openai.chat", True: "openai.responses"}


@pytest.fixture
def gateway(tmp_path: Path, fake: FakeUpstreamThread) -> Iterator[GatewayThread]:
    with GatewayThread(make_settings(tmp_path, fake.base_url)) as gw:
        yield gw


def _records(gateway: GatewayThread) -> list[RecordView]:
    page = gateway.store.list_records("support", RecordFilter(), None, 50)
    return sorted(page.records, key=lambda record: (record.created_at, record.turn))


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_langchain_chat_tools_and_stream_are_recorded(
    gateway: GatewayThread, responses: bool
) -> None:
    llm = ChatOpenAI(
        base_url=gateway.url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        model="reef/support",
        max_retries=0,
        max_tokens=64,  # type: ignore[call-arg]
        include_response_headers=True,
        use_responses_api=responses,
    )
    reply = llm.invoke("I was charged twice this month")
    assert reply.text == "echo: I was charged twice this month"
    receipt = reply.response_metadata["headers"]["x-reef-record-id"]
    # a tool loop: the model's call, the tool's result, the answer
    question = "what is the weather?"
    called = llm.bind_tools([get_weather]).invoke(question)
    (tool_call,) = called.tool_calls
    assert tool_call["name"] == "get_weather" and tool_call["args"] == {"city": "Paris"}
    result = ToolMessage(get_weather.invoke(tool_call["args"]), tool_call_id=tool_call["id"])
    answer = llm.bind_tools([get_weather]).invoke([("user", question), called, result])
    assert answer.text == "tool said: sunny in Paris"
    streamed = "".join(chunk.text for chunk in llm.stream("stream me"))
    assert streamed == "echo: stream me"

    first, call, after, stream = _records(gateway)
    assert {r.api for r in (first, call, after, stream)} == {API[responses]}
    assert {r.status for r in (first, call, after, stream)} == {"ok"}
    assert first.id == receipt
    assert call.session_id == after.session_id and (call.turn, after.turn) == (0, 1)
    assert len({first.session_id, call.session_id, stream.session_id}) == 3


@pytest.mark.parametrize("model_class", [OpenAIChatModel, OpenAIResponsesModel])
def test_a_pydantic_ai_agent_tool_loop_is_one_session(
    gateway: GatewayThread, model_class: type[OpenAIChatModel] | type[OpenAIResponsesModel]
) -> None:
    async def run() -> str:
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="unused", max_retries=0
        ) as client:  # closed with the loop: no connection outlives the test
            provider = OpenAIProvider(openai_client=client)
            agent = Agent(model_class("reef/support", provider=provider), instructions="Use it.")

            @agent.tool_plain
            def weather(city: str) -> str:
                """The weather in a city."""
                return f"sunny in {city}"

            return (await agent.run("what is the weather?")).output

    assert asyncio.run(run()) == "tool said: sunny in Paris"
    call, answer = _records(gateway)
    api = API[model_class is OpenAIResponsesModel]
    assert (call.api, answer.api) == (api, api)
    assert call.session_id == answer.session_id and (call.turn, answer.turn) == (0, 1)
    assert call.response is not None and answer.response is not None
