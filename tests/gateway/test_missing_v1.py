"""A client whose base URL leaves out ``/v1`` gets a 404 that says where the API is."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

# (method, path without /v1, the route it meant)
WITHOUT_V1 = [
    ("POST", "/chat/completions", "/v1/chat/completions"),
    ("POST", "/responses", "/v1/responses"),
    ("POST", "/messages", "/v1/messages"),
    ("POST", "/completions", "/v1/completions"),
    ("POST", "/embeddings", "/v1/embeddings"),
    ("GET", "/models", "/v1/models"),
    ("GET", "/models/reef/default", "/v1/models/reef/default"),
    ("GET", "/responses/resp_1/input_items", "/v1/responses/resp_1/input_items"),
]


def test_an_openai_client_without_v1_is_told_the_base_url(module_gateway: GatewayThread) -> None:
    client = openai.OpenAI(base_url=module_gateway.url, api_key="none", max_retries=0)
    try:
        with pytest.raises(openai.NotFoundError) as raised:
            client.chat.completions.create(
                model="reef/default", messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        client.close()
    message = raised.value.message
    assert "POST /v1/chat/completions" in message, message
    assert f"base URL {module_gateway.url}/v1" in message, message


def test_an_anthropic_client_with_v1_twice_is_not_misled(module_gateway: GatewayThread) -> None:
    # Anthropic's SDK adds /v1 itself: a base URL with /v1 asks for /v1/v1/messages,
    # which is no API path with /v1 left out; the 404 names the path asked for.
    client = anthropic.Anthropic(base_url=module_gateway.url + "/v1", api_key="none", max_retries=0)
    try:
        with pytest.raises(anthropic.NotFoundError) as raised:
            client.messages.create(
                model="reef/default", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        client.close()
    assert "/v1/v1/messages" in str(raised.value)


@pytest.mark.parametrize(("method", "path", "meant"), WITHOUT_V1)
def test_an_api_path_without_v1_suggests_it(
    module_gateway: GatewayThread, method: str, path: str, meant: str
) -> None:
    response = call(module_gateway.port, method, path, {} if method == "POST" else None)
    assert response.status == 404
    body = json.loads(response.body)
    message = body["error"]["message"]
    assert f"the API is under /v1: {method} {meant}" in message, message
    # Anthropic's path answers in Anthropic's error shape, as /v1/messages does.
    assert body.get("type") == ("error" if meant == "/v1/messages" else None), body


@pytest.mark.parametrize("path", ["/nothing/here", "/v1/chat/complete", "/v1x/models"])
def test_other_unknown_paths_get_no_suggestion(module_gateway: GatewayThread, path: str) -> None:
    response = call(module_gateway.port, "GET", path)
    assert response.status == 404
    message = json.loads(response.body)["error"]["message"]
    assert message == f"Not Found: GET {path}", message
