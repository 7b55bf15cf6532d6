"""Teacher/student routing of the Responses API and legacy text completions
(``reef.gateway.distill``), as chat is routed (``test_distill_routing``): the official
OpenAI SDK (and the OpenAI Agents SDK's default Responses model) against a real gateway,
the fake student (``student: ...``, or what a rule catches) and the fake upstream as the
teacher (``echo: ...``). A teacher-answered Responses record is a ``distill`` target."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
from agents.models.multi_provider import MultiProvider
from openai import AsyncOpenAI

from reef.learning.learners.sft import supervised_example
from reef.learning.selection import SelectionConfig, select_experience
from reef.learning.teacher import answered_by_teacher, teacher_reference
from reef.releases import ReleaseChain
from tests.fakes.student import StudentThread
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.gateway.test_distill_routing import release, settings

# The Responses API's function tool: flat, its schema under ``parameters``.
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]
SCHEMA_FORMAT = {
    "type": "json_schema",
    "name": "answer",
    "schema": {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
    },
}


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, student: StudentThread, teacher: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    """Both upstreams take a Responses request as its chat translation."""
    tmp = tmp_path_factory.mktemp("distill-apis")
    with GatewayThread(settings(tmp, student.base_url, teacher.base_url)) as gw:
        yield gw


@pytest.fixture(scope="module")
def native(
    tmp_path_factory: pytest.TempPathFactory, student: StudentThread, teacher: FakeUpstreamThread
) -> Iterator[GatewayThread]:
    """Both upstreams take a Responses request on their own ``/responses``."""
    tmp = tmp_path_factory.mktemp("distill-native")
    both = {"responses": "native"}
    with GatewayThread(settings(tmp, student.base_url, teacher.base_url, both, both)) as gw:
        yield gw


def client(gateway: GatewayThread, pin: str | None, **headers: str) -> openai.OpenAI:
    """The app's client: its scenario by header, its own model names (``gpt-4o``)."""
    pinned = {"x-reef-release": pin} if pin else {}
    return gateway.openai(**{"x-reef-scenario": "support", **pinned, **headers})


def respond(
    gateway: GatewayThread, pin: str | None, question: str, /, **extra: Any
) -> tuple[Any, Any]:
    """One Responses request (``extra``: its other fields, and ``headers``); the SDK's
    response and its record."""
    headers = extra.pop("headers", {})
    raw = client(gateway, pin, **headers).responses.with_raw_response.create(
        model="gpt-4o", input=question, **extra
    )
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert raw.headers["x-reef-served-by"] == record.tags["reef.served_by"]
    return raw.parse(), record


def respond_streamed(gateway: GatewayThread, pin: str, text: str) -> tuple[str, Any]:
    """One streamed Responses request; its text deltas joined and its record."""
    with client(gateway, pin).responses.with_streaming_response.create(
        model="gpt-4o", input=text, stream=True
    ) as response:
        served_by = response.headers["x-reef-served-by"]
        record_id = response.headers["x-reef-record-id"]
        events = list(response.parse())
    pieces = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert events[-1].type == "response.completed"
    record = gateway.store.get_record(record_id)
    assert record.status == "ok" and record.tags["reef.served_by"] == served_by
    return "".join(pieces), record


def complete(gateway: GatewayThread, pin: str | None, prompt: str, **extra: Any) -> tuple[Any, Any]:
    """One legacy text completion; the SDK's answer and its record."""
    headers = extra.pop("headers", {})
    raw = client(gateway, pin, **headers).completions.with_raw_response.create(
        model="gpt-3.5-turbo-instruct", prompt=prompt, **extra
    )
    record = gateway.store.get_record(raw.headers["x-reef-record-id"])
    assert raw.headers["x-reef-served-by"] == record.tags["reef.served_by"]
    return raw.parse(), record


def complete_streamed(gateway: GatewayThread, pin: str, prompt: str) -> tuple[str, Any]:
    with client(gateway, pin).completions.with_streaming_response.create(
        model="gpt-3.5-turbo-instruct", prompt=prompt, stream=True
    ) as response:
        served_by = response.headers["x-reef-served-by"]
        record_id = response.headers["x-reef-record-id"]
        text = "".join(chunk.choices[0].text for chunk in response.parse() if chunk.choices)
    record = gateway.store.get_record(record_id)
    assert record.status == "ok" and record.tags["reef.served_by"] == served_by
    return text, record


# -- the Responses API ------------------------------------------------------------------


def test_responses_route_by_share(
    gateway: GatewayThread, student: StudentThread, teacher: FakeUpstreamThread
) -> None:
    answer, record = respond(gateway, release(gateway, 0.0), "what is two plus two")
    assert answer.output_text == "echo: what is two plus two"
    assert answer.model == "gpt-4o"  # the app's own name, whoever answered
    assert record.tags["reef.served_by"] == "teacher" and "reef.escalation" not in record.tags
    # the teacher got the chat translation under the teacher's model
    assert teacher.last_request_path == "/v1/chat/completions"
    assert teacher.last_request_body["model"] == "teacher-model"
    assert record.price["model"] == "teacher-model"
    answer, record = respond(gateway, release(gateway, 1.0), "what is three plus three")
    assert answer.output_text == "student: what is three plus three"
    assert record.tags["reef.served_by"] == "student"
    assert student.requests[-1]["model"] == "student-model"
    assert "reef.student_attempt" not in record.tags


def test_a_response_continued_on_the_other_arm_carries_its_conversation(
    gateway: GatewayThread, student: StudentThread
) -> None:
    first, _ = respond(gateway, release(gateway, 0.0), "remember the number seven")
    assert first.output_text == "echo: remember the number seven"
    answer, record = respond(
        gateway, release(gateway, 1.0), "which number", previous_response_id=first.id
    )
    assert answer.output_text == "student: which number"
    assert record.tags["reef.served_by"] == "student"
    sent = student.requests[-1]["messages"]
    assert {"role": "assistant", "content": "echo: remember the number seven"} in sent


def test_the_header_asks_the_teacher_for_a_response(gateway: GatewayThread) -> None:
    pin = release(gateway, 1.0)
    headers = {"x-reef-escalate": "teacher"}
    answer, record = respond(gateway, pin, "from the teacher", headers=headers)
    assert answer.output_text == "echo: from the teacher"
    assert record.tags["reef.escalation"] == "header"
    assert "reef.student_attempt" not in record.tags


@pytest.mark.parametrize(
    ("text", "extra", "rule"),
    [
        ("refuse this", {}, "refusal_or_empty"),
        ("refusal-field this", {}, "refusal_or_empty"),
        ("empty this", {}, "refusal_or_empty"),
        ("unknown-tool call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("bad-args call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("bad-json answer", {"text": {"format": {"type": "json_object"}}}, "invalid_json"),
        ("good-json answer", {"text": {"format": SCHEMA_FORMAT}}, "invalid_json"),
    ],
)
def test_a_rule_escalates_a_response_to_the_teacher(
    gateway: GatewayThread, text: str, extra: dict[str, Any], rule: str
) -> None:
    answer, record = respond(gateway, release(gateway, 1.0), text, **extra)
    assert answer.output_text == f"echo: {text}"
    assert record.tags["reef.served_by"] == "teacher"
    assert record.tags["reef.escalation"] == rule
    attempt = orjson.loads(record.tags["reef.student_attempt"])
    assert attempt["response"]["model"] == "student-model"  # the student's own answer
    assert attempt["price"]["model"] == "student-model"
    assert record.price["model"] == "teacher-model"


def test_a_valid_tool_call_of_the_student_stands(gateway: GatewayThread) -> None:
    answer, record = respond(gateway, release(gateway, 1.0), "good-tool call", tools=TOOLS)
    [call] = [item for item in answer.output if item.type == "function_call"]
    assert call.name == "get_weather" and orjson.loads(call.arguments) == {"city": "Paris"}
    assert record.tags["reef.served_by"] == "student"


def test_responses_streams_route_by_share_and_a_buffer_escalates(
    gateway: GatewayThread,
) -> None:
    text, record = respond_streamed(gateway, release(gateway, 1.0), "stream me please")
    assert text == "student: stream me please"
    text, record = respond_streamed(gateway, release(gateway, 0.0), "stream me please")
    assert text == "echo: stream me please"
    assert record.tags["reef.served_by"] == "teacher"
    buffered = release(gateway, 1.0, stream_buffer_tokens=8)
    text, record = respond_streamed(gateway, buffered, "refuse to stream")
    assert text == "echo: refuse to stream"
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    assert orjson.loads(record.tags["reef.student_attempt"])["text"].startswith("I'm sorry")


def test_native_responses_upstreams_route_and_escalate(
    native: GatewayThread, student: StudentThread, teacher: FakeUpstreamThread
) -> None:
    """The student's own Responses answers are read by the rules (a ``refusal`` part,
    ``function_call`` items against flat tools, ``text.format``), and the teacher is
    asked on its own ``/responses``."""
    pin = release(native, 1.0)
    answer, record = respond(native, pin, "hello natively")
    assert answer.output_text == "student: hello natively"
    assert student.requests[-1]["input"] == "hello natively"  # passed through
    assert record.tags["reef.served_by"] == "student"
    answer, record = respond(native, pin, "good-tool call", tools=TOOLS)
    assert record.tags["reef.served_by"] == "student"
    cases = [
        ("refusal-field here", {}, "refusal_or_empty"),
        ("unknown-tool call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("bad-args call", {"tools": TOOLS}, "invalid_tool_calls"),
        ("good-json answer", {"text": {"format": SCHEMA_FORMAT}}, "invalid_json"),
    ]
    for text, extra, rule in cases:
        answer, record = respond(native, pin, text, **extra)
        assert record.tags["reef.escalation"] == rule, text
        assert answer.output_text == f"echo: {text}"
        assert teacher.last_request_path == "/v1/responses"
        assert teacher.last_request_body["model"] == "teacher-model"
    buffered = release(native, 1.0, stream_buffer_tokens=8)
    text, record = respond_streamed(native, buffered, "refuse to stream")
    assert text == "echo: refuse to stream"
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    text, record = respond_streamed(native, buffered, "a good answer to stream natively")
    assert text == "student: a good answer to stream natively"


def test_an_anthropic_teacher_answers_responses_and_refuses_completions(
    tmp_path_factory: pytest.TempPathFactory, student: StudentThread, teacher: FakeUpstreamThread
) -> None:
    tmp = tmp_path_factory.mktemp("distill-anthropic")
    claude = {"type": "anthropic", "api_key": "x"}
    with GatewayThread(settings(tmp, student.base_url, teacher.base_url, teacher=claude)) as gw:
        answer, record = respond(gw, None, "the first request")  # the first release: share 0
        assert answer.output_text == "echo: the first request"
        assert teacher.last_request_path == "/v1/messages"
        assert record.tags["reef.served_by"] == "teacher"
        pin = release(gw, 1.0)
        answer, record = respond(gw, pin, "refuse this")
        assert answer.output_text == "echo: refuse this"
        assert record.tags["reef.escalation"] == "refusal_or_empty"
        with pytest.raises(openai.BadRequestError, match="Anthropic upstream") as refused:
            client(gw, pin).completions.create(model="gpt-4o", prompt="hello")
        assert "routing.teacher" in str(refused.value)
        fmt = {"type": "json_object"}
        with pytest.raises(openai.BadRequestError, match="the release's teacher 'teacher'"):
            client(gw, pin).responses.create(model="gpt-4o", input="x", text={"format": fmt})


def test_teacher_answered_responses_and_completions_are_distill_targets(
    gateway: GatewayThread,
) -> None:
    """The ``distill`` learner's path from a record to its training example: an
    escalated response, a response the teacher answered with a tool call, an escalated
    completion; the student's own response is no target."""
    pin = release(gateway, 1.0)
    _, escalated = respond(gateway, pin, "refuse to name the capital")
    _, student = respond(gateway, pin, "name the capital")
    _, completed = complete(gateway, pin, "refuse to complete this")
    _, called = respond(gateway, release(gateway, 0.0), "the weather in Paris", tools=TOOLS)
    chain = ReleaseChain(gateway.database)
    config = SelectionConfig(require_feedback=False, holdout_fraction=0.0, max_per_principal=None)
    batch = select_experience(gateway.store, chain, "support", config)

    def example_of(record: Any) -> Any:
        [found] = [e for e in batch.train if record.id in (e.record_id, *e.source_ids)]
        manifest = chain.get_release(record.release_id).manifest
        return found, answered_by_teacher(found, manifest)

    example, taught = example_of(escalated)
    assert taught and example.served_by == "teacher"
    assert teacher_reference(example) == "echo: refuse to name the capital"
    trained = supervised_example(example, reply_is_target=True)
    assert trained is not None and trained.target == "echo: refuse to name the capital"
    assert trained.messages[-1] == {"role": "user", "content": "refuse to name the capital"}
    assert example_of(student)[1] is False
    example, taught = example_of(completed)
    assert taught and teacher_reference(example) == "echo: refuse to complete this"
    example, taught = example_of(called)
    assert taught
    [call] = teacher_reference(example)["tool_calls"]
    assert call["name"] == "get_weather"
    trained = supervised_example(example, reply_is_target=True)
    assert trained is not None and trained.tools and "get_weather" in trained.target


# -- legacy text completions ------------------------------------------------------------


def test_completions_route_by_share_and_header(
    gateway: GatewayThread, teacher: FakeUpstreamThread
) -> None:
    answer, record = complete(gateway, release(gateway, 0.0), "two plus two is")
    assert answer.choices[0].text == "echo: two plus two is"
    assert teacher.last_request_path == "/v1/completions"
    assert teacher.last_request_body["model"] == "teacher-model"
    assert record.tags["reef.served_by"] == "teacher"
    pin = release(gateway, 1.0)
    answer, record = complete(gateway, pin, "three plus three is")
    assert answer.choices[0].text == "student: three plus three is"
    assert record.tags["reef.served_by"] == "student"
    headers = {"x-reef-escalate": "teacher"}
    answer, record = complete(gateway, pin, "asked of the teacher", headers=headers)
    assert answer.choices[0].text == "echo: asked of the teacher"
    assert record.tags["reef.escalation"] == "header"


@pytest.mark.parametrize("text", ["refuse it", "empty"])
def test_a_refused_or_empty_completion_escalates(gateway: GatewayThread, text: str) -> None:
    answer, record = complete(gateway, release(gateway, 1.0), text)
    assert answer.choices[0].text == f"echo: {text}"
    assert record.tags["reef.escalation"] == "refusal_or_empty"
    attempt = orjson.loads(record.tags["reef.student_attempt"])
    assert attempt["response"]["object"] == "text_completion"


def test_a_completions_logprob_rule_asks_for_one_logprob(
    gateway: GatewayThread, student: StudentThread
) -> None:
    pin = release(gateway, 1.0, min_mean_logprob=-1.0)
    answer, record = complete(gateway, pin, "sure of this")
    assert student.requests[-1]["logprobs"] == 1
    assert answer.choices[0].logprobs is None  # asked by Reef, not by the client
    assert float(record.tags["reef.student_mean_logprob"]) == pytest.approx(-0.1)
    answer, record = complete(gateway, pin, "unsure of this")
    assert record.tags["reef.escalation"] == "logprob"
    assert answer.choices[0].text == "echo: unsure of this"


def test_completion_streams_route_by_share_and_a_buffer_escalates(
    gateway: GatewayThread,
) -> None:
    text, _ = complete_streamed(gateway, release(gateway, 1.0), "stream me please")
    assert text == "student: stream me please"
    text, record = complete_streamed(gateway, release(gateway, 0.0), "stream me please")
    assert text == "echo: stream me please"
    assert record.tags["reef.served_by"] == "teacher"
    buffered = release(gateway, 1.0, stream_buffer_tokens=8)
    text, record = complete_streamed(gateway, buffered, "refuse to stream")
    assert text == "echo: refuse to stream"
    assert record.tags["reef.escalation"] == "refusal_or_empty"


# -- the OpenAI Agents SDK ----------------------------------------------------------------


@function_tool
def get_weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def test_an_agents_sdk_agent_is_routed_by_the_release(gateway: GatewayThread) -> None:
    """The SDK's default model (the Responses API) with the app's own model name: the
    student answers at share 1, the teacher (its tool loop included) at share 0."""

    async def run(pin: str, text: str) -> Any:
        headers = {"x-reef-scenario": "support", "x-reef-release": pin}
        async with AsyncOpenAI(
            base_url=gateway.url + "/v1", api_key="none", max_retries=0, default_headers=headers
        ) as sdk:
            agent = Agent(
                name="weather", instructions="Use the tool.", tools=[get_weather], model="gpt-4o"
            )
            config = RunConfig(model_provider=MultiProvider(openai_client=sdk))
            return (await Runner.run(agent, text, run_config=config)).final_output

    set_tracing_disabled(True)  # nothing leaves the machine
    try:
        assert asyncio.run(run(release(gateway, 1.0), "hello agent")) == "student: hello agent"
        taught = asyncio.run(run(release(gateway, 0.0), "what is the weather"))
    finally:
        set_tracing_disabled(False)
    assert taught == "tool said: sunny in Paris"
