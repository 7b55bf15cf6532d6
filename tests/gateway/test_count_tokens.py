"""``POST /v1/messages/count_tokens`` through the official Anthropic SDK: relayed to an
Anthropic upstream, counted by the embedded engine's tokenizer, 501 elsewhere; never
recorded."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest

from reef.experience import RecordFilter
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

MESSAGES: list[anthropic.types.MessageParam] = [
    {"role": "user", "content": "how many tokens are these words"}
]


def _recorded(gateway: GatewayThread, scenario: str) -> int:
    return len(gateway.store.list_records(scenario, RecordFilter(), None, 100).records)


def test_an_anthropic_upstream_counts_the_tokens(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    counted = gateway.anthropic().messages.count_tokens(
        model="reef/claude", system="be brief", messages=MESSAGES
    )
    assert counted.input_tokens == 8  # the fake counts words: 6 + 2
    assert fake.last_request_path == "/v1/messages/count_tokens"
    assert fake.last_request_body["model"] == "fake-claude"  # the scenario's model
    assert fake.last_request_headers["x-api-key"] == "anthropic-secret"
    assert _recorded(gateway, "claude") == 0


def test_a_vllm_like_upstream_counts_the_chat_translation(
    gateway: GatewayThread, fake: FakeUpstreamThread
) -> None:
    counted = gateway.anthropic().messages.count_tokens(
        model="reef/support", system="be brief", messages=MESSAGES
    )
    assert counted.input_tokens == 8  # the fake's /tokenize counts words
    assert fake.last_request_path == "/tokenize"
    assert fake.last_request_body == {
        "model": "fake-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "how many tokens are these words"},
        ],
    }


def test_an_upstream_that_cannot_count_is_501_saying_which(tmp_path: Path) -> None:
    with (
        FakeUpstreamThread(tokenize=False) as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        with pytest.raises(anthropic.APIStatusError) as info:
            gateway.anthropic().messages.count_tokens(model="reef/support", messages=MESSAGES)
        assert info.value.status_code == 501
        body = info.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        message = body["error"]["message"]
        assert "upstream 'fake'" in message and "/tokenize" in message, message
        assert _recorded(gateway, "support") == 0


def test_the_embedded_engine_counts_with_its_tokenizer(tmp_path: Path) -> None:
    """The count is the prompt the engine is charged for when the same request is sent."""
    pytest.importorskip("torch")
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine
    from reef.engine.server import BackgroundServer

    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), threads=1)).start()
    try:
        settings = make_settings(
            tmp_path,
            engine.base_url,
            upstreams={
                "engine": {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
            },
            scenarios={"tiny": {"upstream": "engine"}},
        )
        with GatewayThread(settings) as gateway:
            client = gateway.anthropic()
            counted = client.messages.count_tokens(
                model="reef/tiny", system="be brief", messages=MESSAGES
            )
            sent = client.messages.create(
                model="reef/tiny", system="be brief", messages=MESSAGES, max_tokens=1
            )
            assert counted.input_tokens == sent.usage.input_tokens > 0
            assert _recorded(gateway, "tiny") == 1  # the message, not the count
    finally:
        engine.stop()
