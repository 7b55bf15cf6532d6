"""Every recorded shape replays as a held-out item: a conversation recorded through a
real gateway (official SDK clients, the fake upstream answering in each dialect's
shapes), graded so the gate selects it, asked again through ``/v1/chat/completions`` by
the gate's runner pinning the head release, answered 2xx, and recorded with the same
canonical conversation as the original.

The shapes: the three dialects (chat completions, Anthropic Messages, Responses, the
last translated for a chat upstream and passed to an upstream's own Responses API),
streamed and not, with plain text, several turns (Responses: by
``previous_response_id``), a tool call and its result, parallel calls, a failed tool,
an image, and (chat) ``content: null`` beside tool calls; and a legacy completion. Each
item is also replayed as an older store holds it (canonical messages), which the runner
renders back into chat form.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.core import dumps, new_id
from reef.evaluation import EvalItem, GatewayTarget
from reef.evaluation.runner import collect_answers
from reef.experience import canonical_exchange
from reef.learning.holdout import holdout_items
from reef.learning.recipes import parse_recipe
from reef.releases import ReleaseChain
from tests.experience.agent import Agent, Call, Dialect
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

PNG = (  # a 1x1 picture
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
IMAGE_URL = f"data:image/png;base64,{PNG}"
RESPONSES_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
APIS = {
    "openai": "openai.chat",
    "anthropic": "anthropic.messages",
    "responses": "openai.responses",
    "responses-native": "openai.responses",
    "completions": "openai.completions",
}
SHAPES = ("text", "multi-turn", "tools", "parallel-tools", "tool-error", "image")


class SupportAgent(Agent):
    """An agent of either dialect on ``support``, the scenario of an OpenAI-compatible
    upstream: the gate replays through chat completions, which a scenario served by an
    Anthropic upstream does not take."""

    @property
    def scenario(self) -> str:
        return "support"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    """``support`` translates Responses into chat completions; ``native`` passes them to
    the fake's own Responses API (``upstreams.<u>.responses: native``)."""
    directory = tmp_path_factory.mktemp("replay")
    with FakeUpstreamThread() as fake:
        upstream = {"type": "openai", "base_url": fake.base_url, "model": "fake-model"}
        settings = make_settings(
            directory,
            fake.base_url,
            upstreams={"fake": upstream, "native": {**upstream, "responses": "native"}},
            scenarios={"support": {"upstream": "fake"}, "native": {"upstream": "native"}},
        )
        with GatewayThread(settings) as gw:
            yield gw


# -- recording each shape ----------------------------------------------------------------


def _sdk_conversation(gateway: GatewayThread, dialect: Dialect, stream: bool, shape: str) -> str:
    """Record ``shape`` through the ``dialect``'s SDK; the id of its last turn's record."""
    agent = SupportAgent(gateway, dialect, stream=stream, system="Answer briefly.")
    token = new_id()  # its own conversation: no other test's turns join its session
    if shape == "text":
        return agent.user(f"hello {token}").ask(tools=False).record_id
    if shape == "multi-turn":
        agent.user(f"hello {token}").ask(tools=False)
        agent.user("and once more").ask(tools=False)
        return agent.user("thanks").ask(tools=False).record_id
    if shape == "image":
        agent.history.append({"role": "user", "content": _image_parts(dialect, token)})
        return agent.ask(tools=False).record_id
    parallel = "parallel " if shape == "parallel-tools" else ""
    asked = agent.user(f"what is the {parallel}weather? {token}").ask()
    assert len(asked.calls) == (2 if parallel else 1)
    if dialect == "openai" and shape == "tools":
        # The reply as a client re-sends it: no text beside the call, content null.
        agent.history[-1] = {**agent.history[-1], "content": None}
    if shape == "tool-error":
        _failed_tool(agent, asked.calls[0])
    else:
        agent.results(*((c, f"sunny in {c.id}") for c in asked.calls))
    return agent.ask().record_id


def _image_parts(dialect: Dialect, token: str) -> list[dict[str, Any]]:
    if dialect == "openai":
        image = {"type": "image_url", "image_url": {"url": IMAGE_URL}}
    else:
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png"}}
        image["source"]["data"] = PNG
    return [{"type": "text", "text": f"what is on this picture? {token}"}, image]


def _failed_tool(agent: Agent, failed: Call) -> None:
    if agent.dialect == "openai":
        agent.results((failed, "error: the weather service is down"))
        return
    block = {"type": "tool_result", "tool_use_id": failed.id, "is_error": True}
    block["content"] = [{"type": "text", "text": "the weather service is down"}]
    agent.history.append({"role": "user", "content": [block]})


def _responses_conversation(gateway: GatewayThread, scenario: str, stream: bool, shape: str) -> str:
    """Record ``shape`` through the Responses API of the OpenAI SDK; the last turn's
    record id. Later turns continue with ``previous_response_id`` (the record then holds
    the whole conversation, resolved by the gateway), but for parallel calls, whose
    second turn re-sends the whole input as a stateless client does."""
    token = new_id()
    ask = _responses_caller(gateway, scenario, stream)
    if shape == "text":
        return ask({"input": f"hello {token}"})[1]
    if shape == "multi-turn":
        first, _ = ask({"input": f"hello {token}"})
        second, _ = ask({"previous_response_id": first["id"], "input": "and once more"})
        return ask({"previous_response_id": second["id"], "input": "thanks"})[1]
    if shape == "image":
        content = [
            {"type": "input_text", "text": f"what is on this picture? {token}"},
            {"type": "input_image", "image_url": IMAGE_URL, "detail": "low"},
        ]
        return ask({"input": [{"role": "user", "content": content}]})[1]
    parallel = "parallel " if shape == "parallel-tools" else ""
    question = {"role": "user", "content": f"what is the {parallel}weather? {token}"}
    first, _ = ask({"input": [question], "tools": [RESPONSES_TOOL]})
    calls = [item for item in first["output"] if item["type"] == "function_call"]
    assert len(calls) == (2 if parallel else 1)
    said = "error: the weather service is down" if shape == "tool-error" else "sunny"
    outputs = [
        {"type": "function_call_output", "call_id": c["call_id"], "output": f"{said} {n}"}
        for n, c in enumerate(calls)
    ]
    if parallel:
        body = {"input": [question, *first["output"], *outputs]}
    else:
        body = {"previous_response_id": first["id"], "input": outputs}
    return ask({**body, "tools": [RESPONSES_TOOL]})[1]


def _responses_caller(
    gateway: GatewayThread, scenario: str, stream: bool
) -> Callable[[dict[str, Any]], tuple[dict[str, Any], str]]:
    client, model = gateway.openai(), f"reef/{scenario}"

    def ask(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The response object and the record id of one Responses call."""
        if not stream:
            raw = client.responses.with_raw_response.create(model=model, **body)
            return raw.parse().model_dump(exclude_none=True), raw.headers["x-reef-record-id"]
        with client.responses.with_streaming_response.create(
            model=model, stream=True, **body
        ) as response:
            events = list(response.parse())
            record_id = response.headers["x-reef-record-id"]
        [done] = [e for e in events if e.type == "response.completed"]
        return done.response.model_dump(exclude_none=True), record_id

    return ask


# -- the property ------------------------------------------------------------------------


def _completion(gateway: GatewayThread, stream: bool) -> str:
    """A legacy text completion (its prompt is the held-out conversation)."""
    client, prompt = gateway.openai(), f"Once upon a time {new_id()}"
    if not stream:
        raw = client.completions.with_raw_response.create(model="reef/support", prompt=prompt)
        return raw.headers["x-reef-record-id"]
    with client.completions.with_streaming_response.create(
        model="reef/support", prompt=prompt, stream=True
    ) as response:
        list(response.parse())
        return response.headers["x-reef-record-id"]


# The fake's own Responses API makes one call at a time: no parallel calls natively.
NATIVE_SHAPES = tuple(shape for shape in SHAPES if shape != "parallel-tools")
CASES = [
    pytest.param(dialect, stream, shape, id=f"{dialect}-{'stream' if stream else 'json'}-{shape}")
    for dialect, shapes in (
        ("openai", SHAPES),
        ("anthropic", SHAPES),
        ("responses", SHAPES),
        ("responses-native", NATIVE_SHAPES),
        ("completions", ("text",)),
    )
    for stream in (False, True)
    for shape in shapes
]


@pytest.mark.parametrize(("dialect", "stream", "shape"), CASES)
def test_a_recorded_shape_replays_as_a_held_out_item_with_its_conversation_intact(
    gateway: GatewayThread, dialect: str, stream: bool, shape: str
) -> None:
    scenario = "native" if dialect == "responses-native" else "support"
    if dialect.startswith("responses"):
        record_id = _responses_conversation(gateway, scenario, stream, shape)
    elif dialect == "completions":
        record_id = _completion(gateway, stream)
    else:
        agent_dialect: Dialect = "openai" if dialect == "openai" else "anthropic"
        record_id = _sdk_conversation(gateway, agent_dialect, stream, shape)
    original = gateway.store.get_record(record_id)
    assert original.status == "ok" and original.api == APIS[dialect]
    graded = call(
        gateway.port,
        "POST",
        "/reef/feedback",
        {"record_ids": [record_id], "score": 1},
        {"x-reef-scenario": scenario},
    )
    assert graded.status == 201, graded.body

    item = _held_out_item(gateway, scenario, record_id)
    canonical = canonical_exchange(original).messages
    stored_canonical = dataclasses.replace(item, id=f"{record_id}-canonical", messages=canonical)
    head = ReleaseChain(gateway.database).head(scenario)
    assert head is not None
    answers = collect_answers(
        GatewayTarget(base_url=gateway.url, scenario=scenario, retries=0),
        [item, stored_canonical],
        {"baseline": head.id},
        defaults={"max_tokens": 64},
    )

    assert [a.error for a in answers] == [None, None]
    for answer in answers:
        assert answer.text and answer.record_id is not None
        replay = gateway.store.get_record(answer.record_id)
        assert replay.api == "openai.chat" and replay.purpose == "eval" and replay.status == "ok"
        assert replay.release_id == head.id
        assert canonical_exchange(replay).messages == canonical
    lossless = gateway.store.get_record(answers[0].record_id).request["messages"]
    if shape == "image":  # the picture itself went out again, not its digest
        assert PNG in dumps(lossless).decode()
    if shape == "tool-error":
        assert "weather service is down" in dumps(lossless).decode()


def _held_out_item(gateway: GatewayThread, scenario: str, record_id: str) -> EvalItem:
    recipe = parse_recipe({"learners": [{"type": "fewshot"}], "selection": {"holdout_fraction": 1}})
    chain = ReleaseChain(gateway.database)
    items = {i.id: i for i in holdout_items(gateway.store, chain, scenario, recipe)}
    assert record_id in items, f"{record_id} was not held out: {sorted(items)}"
    item = items[record_id]
    for message in item.messages:  # OpenAI chat form: calls nested, content present
        assert "content" in message
        for tool_call in message.get("tool_calls") or ():
            assert tool_call["type"] == "function" and "name" in tool_call["function"]
    return item


def test_the_item_holds_the_records_own_conversation(tmp_path: Path) -> None:
    """Canonical form digests an image; the held-out item carries the part itself."""
    with FakeUpstreamThread() as fake, GatewayThread(make_settings(tmp_path, fake.base_url)) as gw:
        record_id = _sdk_conversation(gw, "anthropic", False, "image")
        sent = call(
            gw.port,
            "POST",
            "/reef/feedback",
            {"record_ids": [record_id], "score": 1},
            {"x-reef-scenario": "support"},
        )
        assert sent.status == 201
        item = _held_out_item(gw, "support", record_id)
        canonical = canonical_exchange(gw.store.get_record(record_id)).messages
    assert "sha256:" in dumps(canonical).decode() and PNG not in dumps(canonical).decode()
    [user] = [m for m in item.messages if m["role"] == "user"]
    assert {"type": "image_url", "image_url": {"url": IMAGE_URL}} in user["content"]
