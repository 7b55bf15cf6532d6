"""No 5xx from a client's body: nesting past the one depth limit, and fields of the wrong
type, are 400s in the caller's dialect that name the limit or the field; nothing reaches
the upstream and nothing is recorded."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from reef.core.jsoncodec import MAX_DEPTH
from reef.experience import RecordFilter
from reef.gateway.openapi.document import openapi_document
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import RawResponse, call

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
USER = [{"role": "user", "content": "hello"}]
TO_CLAUDE = {"x-reef-scenario": "claude"}  # an Anthropic upstream: passed through
TO_SUPPORT = {"x-reef-scenario": "support"}  # an OpenAI upstream: translated


def nested(depth: int) -> str:
    """JSON text of arrays nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth


def chat_with_metadata(depth: int) -> bytes:
    """A chat body nested ``depth`` levels deep in all (the body object is level 1)."""
    head = '{"model":"reef/support","messages":[{"role":"user","content":"deep"}],"metadata":'
    return (head + nested(depth - 1) + "}").encode()


def assert_openai_400(response: RawResponse, *fragments: str) -> dict[str, Any]:
    assert response.status == 400, response.body
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    return dict(error)


def assert_anthropic_400(response: RawResponse, *fragments: str) -> None:
    assert response.status == 400, response.body
    document = response.json()
    assert document["type"] == "error"
    assert document["error"]["type"] == "invalid_request_error"
    for fragment in fragments:
        assert fragment in document["error"]["message"], document["error"]["message"]


def documented_errors(schema: str, body: dict[str, Any]) -> list[str]:
    """Where ``body`` breaks the OpenAPI document's schema ``schema`` (empty: it fits)."""
    root = {"$ref": f"#/components/schemas/{schema}", **openapi_document()}
    validator = jsonschema.Draft202012Validator(root)
    return [error.json_path for error in validator.iter_errors(body)]


def stored(gateway: GatewayThread, scenario: str) -> int:
    return len(gateway.store.list_records(scenario, RecordFilter(), None, 500).records)


def refused_silently(
    gateway: GatewayThread, fake: FakeUpstreamThread, scenario: str, send: Any
) -> RawResponse:
    """``send()``'s response, checking it neither reached the upstream nor was stored."""
    paths = ("/v1/chat/completions", "/v1/messages", "/v1/completions", "/v1/embeddings")
    before = sum(fake.requests_received(p) for p in paths), stored(gateway, scenario)
    response: RawResponse = send()
    assert (sum(fake.requests_received(p) for p in paths), stored(gateway, scenario)) == before
    return response


# -- nesting -----------------------------------------------------------------------------


def test_a_body_nested_to_the_limit_is_served_recorded_and_read_back(
    gateway: GatewayThread,
) -> None:
    response = call(gateway.port, "POST", CHAT, chat_with_metadata(MAX_DEPTH))
    assert response.status == 200, response.body
    record_id = response.headers["x-reef-record-id"]
    read = call(gateway.port, "GET", f"/reef/records/{record_id}")
    assert read.status == 200, read.body
    metadata = read.json()["request"]["metadata"]
    assert json.dumps(metadata, separators=(",", ":")) == nested(MAX_DEPTH - 1)


# 254..1024 used to be 500s: orjson parses 1024 levels but writes only 254.
@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 254, 256, 1024, 1100])
def test_a_body_nested_past_the_limit_is_400_naming_it(
    module_gateway: GatewayThread, fake: FakeUpstreamThread, depth: int
) -> None:
    response = refused_silently(
        module_gateway,
        fake,
        "support",
        lambda: call(module_gateway.port, "POST", CHAT, chat_with_metadata(depth)),
    )
    assert_openai_400(response, f"deeper than {MAX_DEPTH} levels")


def test_nesting_past_the_limit_on_messages_and_feedback_is_400(
    module_gateway: GatewayThread,
) -> None:
    gateway = module_gateway
    head = '{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"metadata":'
    body = (head + nested(300) + "}").encode()
    response = call(gateway.port, "POST", MESSAGES, body, TO_SUPPORT)
    assert_anthropic_400(response, f"deeper than {MAX_DEPTH} levels")
    feedback = '{"record_ids":["r"],"score":1,"metadata":{"deep":' + nested(300) + "}}"
    response = call(gateway.port, "POST", "/reef/feedback", feedback.encode())
    assert_openai_400(response, f"deeper than {MAX_DEPTH} levels")


# -- /v1/messages ------------------------------------------------------------------------

ANTHROPIC_BAD: list[tuple[dict[str, Any], str]] = [
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": ["a", "b"]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"text": "no type"}]}]},
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image", "source": "x"}]}]},
        "messages[0].content[0].source",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "content": [5]}]},
            ]
        },
        "messages[0].content[0].content[0]",
    ),
    (
        {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "input": "x"}]}]},
        "messages[0].content[0].input",
    ),
    ({"system": 5}, "system"),
    ({"system": ["be brief"]}, "system[0]"),
    ({"tool_choice": "any"}, "tool_choice"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": "x"}, "tools"),
    ({"tools": [5]}, "tools[0]"),
    ({"tools": [{"name": "t", "input_schema": "x"}]}, "tools[0].input_schema"),
    ({"metadata": "x"}, "metadata"),
    ({"metadata": {"user_id": 5}}, "metadata.user_id"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"stop_sequences": [1]}, "stop_sequences[0]"),
    ({"stream": "yes"}, "stream"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 1e30}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 2}, "top_p"),
    ({"top_k": 1.5}, "top_k"),
    ({"model": 5}, "model"),
]


@pytest.mark.parametrize("headers", [TO_SUPPORT, TO_CLAUDE], ids=["translated", "passthrough"])
@pytest.mark.parametrize(("change", "field"), ANTHROPIC_BAD)
def test_messages_with_a_field_of_the_wrong_type_is_400_naming_it(
    module_gateway: GatewayThread,
    fake: FakeUpstreamThread,
    change: dict[str, Any],
    field: str,
    headers: dict[str, str],
) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": USER, **change}
    response = refused_silently(
        module_gateway,
        fake,
        headers["x-reef-scenario"],
        lambda: call(module_gateway.port, "POST", MESSAGES, body, headers),
    )
    assert_anthropic_400(response, f"'{field}'")
    assert documented_errors("MessagesRequest", body), "the document allows what is refused"


@pytest.mark.parametrize("headers", [TO_SUPPORT, TO_CLAUDE], ids=["translated", "passthrough"])
def test_messages_using_every_checked_field_correctly_is_served(
    module_gateway: GatewayThread, headers: dict[str, str]
) -> None:
    body = {
        "model": "m",
        "max_tokens": 20,
        "system": [{"type": "text", "text": "be brief"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "calling"},
                    {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "t1", "is_error": False,
                     "content": [{"type": "text", "text": "warm"}]},
                    {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
                ],
            },
        ],
        "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "metadata": {"user_id": "u1"},
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_p": 1,
        "top_k": 5,
        "stream": False,
    }  # fmt: skip
    assert documented_errors("MessagesRequest", body) == []
    response = call(module_gateway.port, "POST", MESSAGES, body, headers)
    assert response.status == 200, response.body
    assert response.json()["type"] == "message"


# -- /v1/chat/completions ----------------------------------------------------------------

OPENAI_BAD: list[tuple[dict[str, Any], str]] = [
    ({"stream": True, "stream_options": "x"}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"stream": "true"}, "stream"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": ["a"]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "assistant", "tool_calls": "x"}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [5]}]}, "messages[0].tool_calls[0]"),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]},
        "messages[0].tool_calls[0].function",
    ),
    (
        {"messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]},
        "messages[0].tool_call_id",
    ),
    ({"tools": "x"}, "tools"),
    ({"tools": [{"type": "function", "function": "f"}]}, "tools[0].function"),
    ({"tool_choice": 5}, "tool_choice"),
    ({"stop": 5}, "stop"),
    ({"n": 0}, "n"),
    ({"n": "2"}, "n"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"temperature": "x"}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"presence_penalty": "x"}, "presence_penalty"),
    ({"frequency_penalty": []}, "frequency_penalty"),
    ({"seed": 1.5}, "seed"),
    ({"model": ["reef/support"]}, "model"),
]


@pytest.mark.parametrize(("change", "field"), OPENAI_BAD)
def test_chat_with_a_field_of_the_wrong_type_is_400_naming_it(
    module_gateway: GatewayThread, fake: FakeUpstreamThread, change: dict[str, Any], field: str
) -> None:
    body = {"model": "reef/support", "messages": USER, **change}
    response = refused_silently(
        module_gateway, fake, "support", lambda: call(module_gateway.port, "POST", CHAT, body)
    )
    error = assert_openai_400(response, f"'{field}'")
    assert error["param"] == field
    assert documented_errors("ChatCompletionRequest", body), "the document allows it"


def test_the_openai_sdk_sees_the_field_as_param(module_gateway: GatewayThread) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        module_gateway.openai().chat.completions.create(
            model="reef/support",
            messages=[{"role": "user", "content": "x"}],
            stream=True,
            stream_options="x",  # type: ignore[arg-type]
        )
    assert info.value.param == "stream_options"
    assert "'stream_options' must be an object" in info.value.message


def test_chat_using_every_checked_field_correctly_is_served(module_gateway: GatewayThread) -> None:
    body = {
        "model": "reef/support",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "weather?", "name": "ann"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "w", "arguments": "{\"city\": \"Paris\"}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "w", "parameters": {}}}],
        "tool_choice": "auto",
        "stop": ["END"],
        "n": 1,
        "max_tokens": 20,
        "max_completion_tokens": 20,
        "temperature": 0,
        "top_p": 0.9,
        "presence_penalty": -1.5,
        "frequency_penalty": 0,
        "seed": -7,
        "stream": None,
        "stream_options": None,
    }  # fmt: skip
    assert documented_errors("ChatCompletionRequest", body) == []
    response = call(module_gateway.port, "POST", CHAT, body)
    assert response.status == 200, response.body
    assert response.json()["object"] == "chat.completion"


# -- 405 ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("GET", CHAT, "POST"), ("PUT", "/reef/feedback", "POST"), ("POST", "/v1/models", "GET")],
)
def test_a_wrong_method_is_405_with_allow_typed_as_invalid_request(
    module_gateway: GatewayThread, method: str, path: str, allowed: str
) -> None:
    response = call(module_gateway.port, method, path, b"{}" if method != "GET" else None)
    assert response.status == 405
    assert allowed in response.headers["allow"].split(", ")
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_wrong_method_on_messages_is_405_in_anthropic_shape(
    module_gateway: GatewayThread,
) -> None:
    response = call(module_gateway.port, "GET", MESSAGES)
    assert response.status == 405
    assert response.headers["allow"] == "POST"
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "invalid_request_error"


# -- /v1/completions and /v1/embeddings --------------------------------------------------

TEXT_BAD: list[tuple[str, str, dict[str, Any], str]] = [
    ("/v1/completions", "CompletionRequest", {"prompt": None}, "prompt"),
    ("/v1/completions", "CompletionRequest", {"prompt": 5}, "prompt"),
    ("/v1/completions", "CompletionRequest", {"prompt": []}, "prompt"),
    ("/v1/completions", "CompletionRequest", {"prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", "CompletionRequest", {"prompt": [[1], [-1]]}, "prompt[1]"),
    ("/v1/completions", "CompletionRequest", {"echo": "yes"}, "echo"),
    ("/v1/completions", "CompletionRequest", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", "CompletionRequest", {"suffix": 1}, "suffix"),
    ("/v1/completions", "CompletionRequest", {"stop": [1]}, "stop[0]"),
    ("/v1/completions", "CompletionRequest", {"max_tokens": 0}, "max_tokens"),
    ("/v1/completions", "CompletionRequest", {"stream_options": []}, "stream_options"),
    ("/v1/embeddings", "EmbeddingsRequest", {"input": None}, "input"),
    ("/v1/embeddings", "EmbeddingsRequest", {"input": {"text": "a"}}, "input"),
    ("/v1/embeddings", "EmbeddingsRequest", {"dimensions": 0}, "dimensions"),
    ("/v1/embeddings", "EmbeddingsRequest", {"dimensions": 70_000}, "dimensions"),
    ("/v1/embeddings", "EmbeddingsRequest", {"encoding_format": "int8"}, "encoding_format"),
    ("/v1/embeddings", "EmbeddingsRequest", {"model": 5}, "model"),
]
_TEXT_DEFAULTS = {"/v1/completions": {"prompt": "hi"}, "/v1/embeddings": {"input": "hi"}}


@pytest.mark.parametrize(("path", "schema", "change", "field"), TEXT_BAD)
def test_text_and_embedding_bodies_of_the_wrong_type_are_400_naming_it(
    module_gateway: GatewayThread,
    fake: FakeUpstreamThread,
    path: str,
    schema: str,
    change: dict[str, Any],
    field: str,
) -> None:
    body = {"model": "reef/support", **_TEXT_DEFAULTS[path], **change}
    response = refused_silently(
        module_gateway, fake, "support", lambda: call(module_gateway.port, "POST", path, body)
    )
    error = assert_openai_400(response, f"'{field}'")
    assert error["param"] == field
    assert documented_errors(schema, body), "the document allows what is refused"


@pytest.mark.parametrize(
    ("path", "schema", "body"),
    [
        (
            "/v1/completions",
            "CompletionRequest",
            {
                "prompt": [[1, 2], [3]],
                "stream": False,
                "stop": ["\n"],
                "echo": False,
                "n": 1,
                "logprobs": 0,
                "seed": 7,
                "max_tokens": 4,
                "temperature": 0,
                "top_p": 1,
            },
        ),
        ("/v1/completions", "CompletionRequest", {"prompt": ["a", "b"], "suffix": "x"}),
        (
            "/v1/embeddings",
            "EmbeddingsRequest",
            {"input": [[1, 2], [3]], "dimensions": 4, "encoding_format": "float"},
        ),
        ("/v1/embeddings", "EmbeddingsRequest", {"input": ["a", "b"], "encoding_format": None}),
    ],
)
def test_text_and_embedding_bodies_using_every_checked_field_are_served(
    module_gateway: GatewayThread, path: str, schema: str, body: dict[str, Any]
) -> None:
    response = call(module_gateway.port, "POST", path, {"model": "reef/support", **body})
    assert response.status == 200, response.body
    assert documented_errors(schema, body) == []


# -- integers written with a zero fraction -----------------------------------------------

WHOLE = [
    (CHAT, "ChatCompletionRequest", {"messages": USER, "n": 2.0, "max_tokens": 16.0}),
    ("/v1/completions", "CompletionRequest", {"prompt": [[1.0, 2], [3]], "seed": -4.0}),
    ("/v1/embeddings", "EmbeddingsRequest", {"input": [7.0, 8], "dimensions": 3.0}),
]


@pytest.mark.parametrize(("path", "schema", "fields"), WHOLE)
def test_an_integer_with_a_zero_fraction_is_that_integer_upstream(
    module_gateway: GatewayThread,
    fake: FakeUpstreamThread,
    path: str,
    schema: str,
    fields: dict[str, Any],
) -> None:
    body = {"model": "reef/support", **fields}
    assert documented_errors(schema, body) == []  # JSON Schema: 2.0 is an integer
    response = call(module_gateway.port, "POST", path, body)
    assert response.status == 200, response.body
    sent = fake.last_request_body
    for key, value in fields.items():
        if key in ("messages",):
            continue
        assert json.dumps(sent[key]) == json.dumps(_as_ints(value)), key


def _as_ints(value: Any) -> Any:
    if isinstance(value, list):
        return [_as_ints(item) for item in value]
    return int(value) if isinstance(value, float) else value
