"""The client libraries people use, in front of a distilled scenario's routing
(``reef.gateway.distill``, docs/distillation.md): LangChain (``langchain-openai``),
pydantic-ai, the OpenAI Agents SDK, the Anthropic SDK and litellm, each configured as its
docs show, with only the base URL changed.

A real gateway on loopback; the fake student (``tests.fakes.student``: ``student: ...``,
or what a rule catches, chosen by a word in the text) and the fake upstream as the
teacher (``echo: ...``; a weather tool call when asked about the weather), so each
answer tells who gave it. The releases route every request to the student (share 1.0)
with the escalation rules on; each test checks that the library parses what it got, and
the record and ``x-reef-served-by`` say who answered.

The Agents SDK runs on both of its model classes: chat completions and the Responses
API (its default), each routed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from agents import Agent as SdkAgent
from agents import OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.models.openai_responses import OpenAIResponsesModel as SdkResponsesModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from reef.config import ReefSettings
from reef.experience import RecordFilter, RecordView
from reef.releases import EscalationRules, ReleaseChain, RoutingComponent, TeacherEndpoint
from tests.fakes.student import StudentThread
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.polling import eventually

# litellm reads its model price map from the network at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm

OPENAI_TEACHER = TeacherEndpoint(upstream="teacher", model="teacher-model")
ANTHROPIC_TEACHER = TeacherEndpoint(upstream="claude", model="teacher-claude")
# scenario -> (the student's upstream, the teacher)
SCENARIOS = {
    "support": ("student", OPENAI_TEACHER),
    # an Anthropic teacher: it serves /v1/messages clients, the student is translated
    "desk": ("student", ANTHROPIC_TEACHER),
    # an Anthropic-compatible student, with either teacher
    "studio": ("claude-student", ANTHROPIC_TEACHER),
    "atelier": ("claude-student", OPENAI_TEACHER),
}


@pytest.fixture(autouse=True, scope="module")
def no_tracing() -> Iterator[None]:
    """The Agents SDK exports traces to OpenAI unless told not to."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, student: StudentThread, teacher: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    tmp: Path = tmp_path_factory.mktemp("distill-clients")
    timeouts = {"read_timeout_seconds": 2, "total_timeout_seconds": 5}
    settings = ReefSettings(
        home=tmp / "home",
        store={"url": f"sqlite:///{tmp / 'reef.db'}"},
        upstreams={
            "student": {"type": "openai", "base_url": student.base_url, "model": "student-model"}
            | timeouts,
            "teacher": {"type": "openai", "base_url": teacher.base_url, "model": "teacher-model"}
            | timeouts,
            "claude": {"type": "anthropic", "base_url": teacher.base_url, "api_key": "k"}
            | {"model": "teacher-claude"}
            | timeouts,
            "claude-student": {"type": "anthropic", "base_url": student.base_url}
            | {"api_key": "k", "model": "student-claude"}
            | timeouts,
        },
        scenarios={
            name: {
                "upstream": upstream,
                "distill": {"teacher": {"upstream": t.upstream, "model": t.model}},
            }
            for name, (upstream, t) in SCENARIOS.items()
        },
    )
    with GatewayThread(settings) as gw:
        yield gw


def route(gateway: GatewayThread, scenario: str, share: float = 1.0, **rules: Any) -> str:
    """Publish a release of ``scenario`` giving the student ``share`` with ``rules`` (all
    on by default), and wait until the gateway serves it to unpinned traffic."""
    chain = ReleaseChain(gateway.database)
    if chain.head(scenario) is None:  # the first request creates the first release
        gateway.anthropic(**{"x-reef-scenario": scenario}).messages.create(
            model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hello"}]
        )
    head = chain.head(scenario)
    assert head is not None
    routing = RoutingComponent(
        student_share=share, teacher=SCENARIOS[scenario][1], escalation=EscalationRules(**rules)
    )
    manifest = head.manifest.model_copy(update={"routing": routing})
    candidate = chain.propose(scenario, manifest, head.id, "test", f"share {share}")
    published = chain.publish(candidate.id, head.id, "test", "test", require_passed=False)

    def serving() -> bool:
        status = httpx.get(f"{gateway.url}/reef/status").json()["scenarios"].get(scenario)
        return bool(status and status.get("serving_release_id") == published.id)

    eventually(serving, f"the gateway to serve {published.id}", timeout_seconds=10)
    return published.id


def newest(gateway: GatewayThread, count: int, scenario: str = "support") -> list[RecordView]:
    """The scenario's ``count`` newest records, oldest first."""
    page = gateway.store.list_records(scenario, RecordFilter(), None, count)
    return sorted(page.records, key=lambda r: (r.created_at, r.turn))


def served(gateway: GatewayThread, headers: Any) -> tuple[str, Any]:
    """The arm a response's headers name, and its record (which must agree)."""
    record = gateway.store.get_record(headers["x-reef-record-id"])
    assert record.tags["reef.served_by"] == headers["x-reef-served-by"]
    return headers["x-reef-served-by"], record


PARIS_CALL = ("get_weather", {"city": "Paris"})


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def chat_openai(gateway: GatewayThread, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=gateway.url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        model="reef/support",
        max_retries=0,
        include_response_headers=True,
        **options,
    )


# -- LangChain -----------------------------------------------------------------------


def test_langchain_chat_and_a_tool_loop_get_the_students_answers(gateway: GatewayThread) -> None:
    route(gateway, "support")
    llm = chat_openai(gateway)
    reply = llm.invoke("what is two plus two")
    assert reply.text == "student: what is two plus two"
    arm, _ = served(gateway, reply.response_metadata["headers"])
    assert arm == "student"
    tools = llm.bind_tools([get_weather])
    called = tools.invoke("good-tool: the weather in Paris?")
    assert isinstance(called, AIMessage) and not called.invalid_tool_calls
    (call,) = called.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    assert served(gateway, called.response_metadata["headers"])[0] == "student"
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = tools.invoke([("user", "good-tool: the weather in Paris?"), called, result])
    assert answer.text == "student: tool said: sunny in Paris"
    assert served(gateway, answer.response_metadata["headers"])[0] == "student"


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("refuse this", "refusal_or_empty"),
        ("refusal-field this", "refusal_or_empty"),
        ("empty this", "refusal_or_empty"),
    ],
)
def test_langchain_an_escalated_chat_gets_the_teachers_answer(
    gateway: GatewayThread, text: str, rule: str
) -> None:
    route(gateway, "support")
    reply = chat_openai(gateway).invoke(text)
    assert reply.text == f"echo: {text}"
    assert not reply.additional_kwargs.get("refusal")  # the student's never arrived
    arm, record = served(gateway, reply.response_metadata["headers"])
    assert (arm, record.tags["reef.escalation"]) == ("teacher", rule)
    assert reply.response_metadata["model_name"] == "teacher-model"


@pytest.mark.parametrize("word", ["unknown-tool", "bad-args", "broken-args"])
def test_langchain_an_invalid_tool_call_is_replaced_by_the_teachers(
    gateway: GatewayThread, word: str
) -> None:
    route(gateway, "support")
    called = chat_openai(gateway).bind_tools([get_weather]).invoke(f"{word}: weather in Paris?")
    assert isinstance(called, AIMessage) and not called.invalid_tool_calls
    (call,) = called.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
    arm, record = served(gateway, called.response_metadata["headers"])
    assert (arm, record.tags["reef.escalation"]) == ("teacher", "invalid_tool_calls")
    attempt = orjson.loads(record.tags["reef.student_attempt"])["response"]
    assert attempt["choices"][0]["message"]["tool_calls"]  # the student's call, kept


def test_langchain_default_headers_ask_the_teacher(
    gateway: GatewayThread, student: StudentThread, teacher: FakeUpstreamThread
) -> None:
    route(gateway, "support")
    asked = len(student.requests)
    llm = chat_openai(gateway, default_headers={"x-reef-escalate": "teacher"})
    reply = llm.invoke("from the teacher please")
    assert reply.text == "echo: from the teacher please"
    arm, record = served(gateway, reply.response_metadata["headers"])
    assert (arm, record.tags["reef.escalation"]) == ("teacher", "header")
    assert teacher.last_request_body["model"] == "teacher-model"
    # Reef's own header routed it; it is not passed on to the upstream
    assert "x-reef-escalate" not in {name.lower() for name in teacher.last_request_headers}
    assert len(student.requests) == asked  # the student was never asked
    assert "reef.student_attempt" not in record.tags


def test_langchain_streams_route_by_share_and_a_buffer_escalates(gateway: GatewayThread) -> None:
    def stream(llm: Any, text: str) -> tuple[Any, str]:
        chunks = list(llm.stream(text))
        whole = chunks[0]
        for chunk in chunks[1:]:
            whole = whole + chunk
        headers = next(
            c.response_metadata["headers"] for c in chunks if "headers" in c.response_metadata
        )
        return whole, served(gateway, headers)[0]

    llm = chat_openai(gateway)
    route(gateway, "support", 1.0)
    whole, arm = stream(llm, "stream me please")
    assert (whole.text, arm) == ("student: stream me please", "student")
    route(gateway, "support", 0.0)
    whole, arm = stream(llm, "stream me please")
    assert (whole.text, arm) == ("echo: stream me please", "teacher")
    # a buffer reads the student's first tokens: a refusal or a bad call goes to the teacher
    route(gateway, "support", 1.0, stream_buffer_tokens=8)
    whole, arm = stream(llm, "refuse to stream")
    assert (whole.text, arm) == ("echo: refuse to stream", "teacher")
    whole, arm = stream(llm.bind_tools([get_weather]), "bad-args: weather in Paris?")
    assert arm == "teacher" and not whole.invalid_tool_calls
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    whole, arm = stream(llm.bind_tools([get_weather]), "good-tool: weather in Paris?")
    assert arm == "student" and not whole.invalid_tool_calls
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    # usage asked: the answering arm's usage chunk comes through, escalated or not
    counted = chat_openai(gateway, stream_usage=True)
    whole, arm = stream(counted, "count me")
    assert arm == "student" and whole.usage_metadata["output_tokens"] == 3
    whole, arm = stream(counted, "refuse to count")
    assert arm == "teacher" and whole.usage_metadata["output_tokens"] == 4


def test_langchain_on_a_scenario_with_an_anthropic_teacher_is_refused(
    gateway: GatewayThread,
) -> None:
    """An Anthropic teacher serves /v1/messages clients only: an OpenAI chat client is
    refused with 400 up front, even when the student would have answered."""
    route(gateway, "desk")
    llm = chat_openai(gateway, default_headers={"x-reef-scenario": "desk"})
    refused = r"routes to the teacher 'claude', an Anthropic upstream"
    with pytest.raises(openai.BadRequestError, match=refused):
        llm.invoke("hello")


# -- pydantic-ai ---------------------------------------------------------------------


class Forecast(BaseModel):
    answer: str


AGENT_RUNS = [
    ("good-tool", "student", False),
    ("bad-args", "teacher", False),
    ("good-tool", "student", True),
    ("bad-args", "teacher", True),  # the buffer catches the streamed bad call
]


@pytest.mark.parametrize(("word", "first_arm", "stream"), AGENT_RUNS)
def test_a_pydantic_ai_agent_with_a_tool_and_structured_output(
    gateway: GatewayThread, word: str, first_arm: str, stream: bool
) -> None:
    """The agent's tool call (the student's, or the teacher's when the student's is
    invalid), then its structured answer (the student's, after the tool result)."""
    route(gateway, "support", stream_buffer_tokens=8)

    async def run() -> Forecast:
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="unused", max_retries=0
        ) as client:
            model = OpenAIChatModel("reef/support", provider=OpenAIProvider(openai_client=client))
            agent = Agent(model, output_type=NativeOutput(Forecast), instructions="Use it.")

            @agent.tool_plain
            def weather(city: str) -> str:
                """The weather in a city."""
                return f"sunny in {city}"

            text = f"{word}: the weather in Paris?"
            if not stream:
                return (await agent.run(text)).output
            async with agent.run_stream(text) as streamed:
                return await streamed.get_output()

    assert asyncio.run(run()) == Forecast(answer="sunny in Paris")
    call, answer = newest(gateway, 2)
    assert call.session_id == answer.session_id and (call.turn, answer.turn) == (0, 1)
    assert call.tags["reef.served_by"] == first_arm
    assert answer.tags["reef.served_by"] == "student"
    assert "reef.escalation" not in answer.tags
    assert answer.request["response_format"]["type"] == "json_schema"


# -- the OpenAI Agents SDK -----------------------------------------------------------


@function_tool
def sdk_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def run_sdk_agent(gateway: GatewayThread, model_class: Any, text: str, stream: bool) -> Any:
    async def run() -> Any:
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="none", max_retries=0
        ) as client:
            model = model_class(model="reef/support", openai_client=client)
            agent = SdkAgent(
                name="weather", instructions="Use the tool.", tools=[sdk_weather], model=model
            )
            if not stream:
                return (await Runner.run(agent, text)).final_output
            streamed = Runner.run_streamed(agent, text)
            async for _ in streamed.stream_events():
                pass
            return streamed.final_output

    return asyncio.run(run())


@pytest.mark.parametrize(("word", "first_arm", "stream"), AGENT_RUNS)
def test_an_agents_sdk_chat_completions_agent_is_routed(
    gateway: GatewayThread, word: str, first_arm: str, stream: bool
) -> None:
    route(gateway, "support", stream_buffer_tokens=8)
    final = run_sdk_agent(gateway, OpenAIChatCompletionsModel, f"{word}: weather in Paris?", stream)
    assert final == "student: tool said: sunny in Paris"
    call, answer = newest(gateway, 2)
    assert call.session_id == answer.session_id
    assert call.tags["reef.served_by"] == first_arm
    assert answer.tags["reef.served_by"] == "student"
    if first_arm == "teacher":
        assert call.tags["reef.escalation"] == "invalid_tool_calls"


@pytest.mark.parametrize(("word", "first_arm", "stream"), AGENT_RUNS)
def test_an_agents_sdk_responses_agent_is_routed(
    gateway: GatewayThread, word: str, first_arm: str, stream: bool
) -> None:
    """The Agents SDK's default model class speaks the Responses API, routed as chat is."""
    route(gateway, "support", stream_buffer_tokens=8)
    final = run_sdk_agent(gateway, SdkResponsesModel, f"{word}: weather in Paris?", stream)
    assert final == "student: tool said: sunny in Paris"
    call, answer = newest(gateway, 2)
    assert call.api == answer.api == "openai.responses"
    assert call.tags["reef.served_by"] == first_arm
    assert answer.tags["reef.served_by"] == "student"
    if first_arm == "teacher":
        assert call.tags["reef.escalation"] == "invalid_tool_calls"


def test_an_agents_sdk_responses_agent_gets_the_teacher_for_a_refusal(
    gateway: GatewayThread,
) -> None:
    route(gateway, "support")
    final = run_sdk_agent(gateway, SdkResponsesModel, "please refuse this", stream=False)
    (record,) = newest(gateway, 1)
    assert record.api == "openai.responses"
    assert record.tags["reef.served_by"] == "teacher"
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    assert final and "sorry" not in final.lower()


# -- the Anthropic SDK, with an Anthropic teacher -------------------------------------


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def test_anthropic_messages_route_to_the_student_and_escalate_to_an_anthropic_teacher(
    gateway: GatewayThread, teacher: FakeUpstreamThread
) -> None:
    route(gateway, "desk")
    client = gateway.anthropic(**{"x-reef-scenario": "desk"})

    def ask(text: str, **extra: Any) -> tuple[Any, str, Any]:
        raw = client.messages.with_raw_response.create(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": text}], **extra
        )
        return (raw.parse(), *served(gateway, raw.headers))

    message, arm, _ = ask("hi there")
    assert (message.content[0].text, arm) == ("student: hi there", "student")
    message, arm, record = ask("refuse it")
    assert (message.content[0].text, arm) == ("echo: refuse it", "teacher")
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    assert teacher.last_request_path == "/v1/messages"
    assert teacher.last_request_body["model"] == "teacher-claude"
    for word, arm_wanted in (("good-tool", "student"), ("bad-args", "teacher")):
        message, arm, _ = ask(f"{word}: weather in Paris?", tools=[WEATHER_TOOL])
        (block,) = message.content
        assert (block.type, block.name, block.input) == (
            "tool_use",
            "get_weather",
            {"city": "Paris"},
        )
        assert message.stop_reason == "tool_use" and arm == arm_wanted
    headers = {"x-reef-scenario": "desk", "x-reef-escalate": "teacher"}
    raw = gateway.anthropic(**headers).messages.with_raw_response.create(
        model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "teach me"}]
    )
    assert raw.parse().content[0].text == "echo: teach me"
    assert served(gateway, raw.headers)[1].tags["reef.escalation"] == "header"


def test_an_anthropic_stream_escalates_from_an_openai_student_to_an_anthropic_teacher(
    gateway: GatewayThread,
) -> None:
    route(gateway, "desk", stream_buffer_tokens=8)
    client = gateway.anthropic(**{"x-reef-scenario": "desk"})
    for text, expected, arm in (
        ("stream me please", "student: stream me please", "student"),
        ("refuse to stream", "echo: refuse to stream", "teacher"),
    ):
        with client.messages.stream(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": text}]
        ) as stream:
            headers = stream.response.headers
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed == expected and final.content[0].text == expected
        assert final.stop_reason == "end_turn"
        assert served(gateway, headers)[0] == arm
    for word, arm in (("good-tool", "student"), ("bad-args", "teacher")):
        with client.messages.stream(
            model="claude-x",
            max_tokens=64,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            messages=[{"role": "user", "content": f"{word}: weather in Paris?"}],
        ) as stream:
            headers = stream.response.headers
            final = stream.get_final_message()
        (block,) = final.content
        assert block.type == "tool_use" and final.stop_reason == "tool_use"
        assert (block.name, block.input) == ("get_weather", {"city": "Paris"})
        assert served(gateway, headers)[0] == arm


@pytest.mark.parametrize("scenario", ["studio", "atelier"])
def test_an_anthropic_student_answers_and_escalates_to_either_teacher(
    gateway: GatewayThread, student: StudentThread, scenario: str
) -> None:
    """An Anthropic-compatible student (``/v1/messages`` upstream): its answers, and the
    rules on them, whole and streamed, with an Anthropic or an OpenAI teacher."""
    route(gateway, scenario, stream_buffer_tokens=8)
    client = gateway.anthropic(**{"x-reef-scenario": scenario})

    def ask(text: str, **extra: Any) -> tuple[Any, str, Any]:
        messages = extra.pop("messages", [{"role": "user", "content": text}])
        raw = client.messages.with_raw_response.create(
            model="claude-x", max_tokens=64, messages=messages, **extra
        )
        return (raw.parse(), *served(gateway, raw.headers))

    message, arm, _ = ask("hi there")
    assert (message.content[0].text, arm) == ("student: hi there", "student")
    assert student.requests[-1]["model"] == "student-claude"
    for text in ("refuse it", "refusal-field it", "empty it"):
        message, arm, record = ask(text)
        assert (message.content[0].text, arm) == (f"echo: {text}", "teacher")
        assert message.stop_reason == "end_turn"
        assert record.tags["reef.escalation"] == "refusal_or_empty"
    for word in ("good-tool", "unknown-tool", "bad-args", "broken-args"):
        question = f"{word}: weather in Paris?"
        message, arm, record = ask(question, tools=[WEATHER_TOOL])
        (block,) = message.content
        assert (block.type, block.name, block.input) == ("tool_use", *PARIS_CALL)
        assert message.stop_reason == "tool_use"
        assert arm == ("student" if word == "good-tool" else "teacher"), word
        if word == "good-tool":  # the loop goes on: the tool's result, the student's answer
            result = {"type": "tool_result", "tool_use_id": block.id, "content": "sunny"}
            turns = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": message.content},
                {"role": "user", "content": [result]},
            ]
            answer, arm, _ = ask("", messages=turns, tools=[WEATHER_TOOL])
            assert (answer.content[0].text, arm) == ("student: tool said: sunny", "student")
    headers = {"x-reef-scenario": scenario, "x-reef-escalate": "teacher"}
    raw = gateway.anthropic(**headers).messages.with_raw_response.create(
        model="claude-x", max_tokens=64, messages=[{"role": "user", "content": "teach me"}]
    )
    assert raw.parse().content[0].text == "echo: teach me"
    # streams: the buffer reads the student's first events, then commits or escalates
    for text, expected, arm in (
        ("stream me please", "student: stream me please", "student"),
        ("refuse to stream", "echo: refuse to stream", "teacher"),
        ("refusal-field stream", "echo: refusal-field stream", "teacher"),
    ):
        with client.messages.stream(
            model="claude-x", max_tokens=64, messages=[{"role": "user", "content": text}]
        ) as stream:
            headers = stream.response.headers
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert (streamed, final.stop_reason) == (expected, "end_turn")
        assert served(gateway, headers)[0] == arm, text
    for word in ("good-tool", "unknown-tool", "bad-args", "broken-args"):
        with client.messages.stream(
            model="claude-x",
            max_tokens=64,
            tools=[WEATHER_TOOL],  # type: ignore[list-item]
            messages=[{"role": "user", "content": f"{word}: weather in Paris?"}],
        ) as stream:
            headers = stream.response.headers
            final = stream.get_final_message()
        (block,) = final.content
        assert (block.type, block.name, block.input) == ("tool_use", *PARIS_CALL), word
        assert served(gateway, headers)[0] == ("student" if word == "good-tool" else "teacher")


# -- litellm -------------------------------------------------------------------------


# litellm builds a pydantic adapter of a TypedDict with ReadOnly items when it first
# dispatches a call (its GitHub Copilot provider): pydantic warns, which is not ours.
@pytest.mark.filterwarnings("ignore:Items? .* using the `ReadOnly` qualifier:UserWarning")
def test_litellm_completion_is_routed(gateway: GatewayThread) -> None:
    route(gateway, "support")
    base = {
        "model": "openai/reef/support",
        "api_base": gateway.url + "/v1",
        "api_key": "none",
        "client": gateway.openai(),  # closed with the gateway (litellm caches its own)
    }

    def complete(text: str, **extra: Any) -> tuple[Any, str, Any]:
        response = litellm.completion(
            messages=[{"role": "user", "content": text}], num_retries=0, **base, **extra
        )
        headers = {
            k.removeprefix("llm_provider-"): v
            for k, v in response._hidden_params["additional_headers"].items()
        }
        return (response.choices[0].message, *served(gateway, headers))

    message, arm, _ = complete("hello litellm")
    assert (message.content, arm) == ("student: hello litellm", "student")
    message, arm, record = complete("refuse this")
    assert (message.content, arm) == ("echo: refuse this", "teacher")
    tools = [orjson.loads(orjson.dumps(t)) for t in [_openai_tool()]]
    for word, arm_wanted in (("good-tool", "student"), ("bad-args", "teacher")):
        message, arm, _ = complete(f"{word}: weather in Paris?", tools=tools)
        (call,) = message.tool_calls
        assert call.function.name == "get_weather" and arm == arm_wanted
        assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    message, arm, record = complete("teach me", extra_headers={"x-reef-escalate": "teacher"})
    assert (message.content, record.tags["reef.escalation"]) == ("echo: teach me", "header")
    pieces = litellm.completion(
        messages=[{"role": "user", "content": "stream me please"}], stream=True, **base
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in pieces if chunk.choices)
    assert text == "student: stream me please"


def _openai_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER_TOOL["input_schema"],
        },
    }
