"""An application keeps its own model name: a scenario with a configured model serves
whatever name the client sends and records the request as sent; on an upstream with no
configured model the client's name goes upstream, and one it does not serve is a 404
naming the models it does."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call
from tests.gateway.sdk_calls import turn

# (client dialect, scenario, the model its upstream is configured with)
CONFIGURED = [
    ("openai", "support", "fake-model"),
    ("anthropic", "claude", "fake-claude"),
    ("anthropic", "support", "fake-model"),  # translated onto the OpenAI-compatible fake
]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("dialect", "scenario", "configured"), CONFIGURED, ids=["openai", "anthropic", "translated"]
)
def test_an_app_keeps_its_model_name(
    gateway: GatewayThread,
    fake: FakeUpstreamThread,
    dialect: str,
    scenario: str,
    configured: str,
    stream: bool,
) -> None:
    client = gateway.openai() if dialect == "openai" else gateway.anthropic()
    own = "gpt-4o" if dialect == "openai" else "my-apps-claude"
    reply = turn(
        client, "my app's question", stream=stream, headers={"x-reef-scenario": scenario}, model=own
    )
    assert reply.status == 200 and "my app's question" in reply.text
    assert fake.last_request_body["model"] == configured
    record = gateway.store.get_record(reply.receipt or "")
    assert record.request["model"] == own  # the request as the client sent it


@pytest.fixture
def passthrough(tmp_path: Path) -> object:
    """A gateway whose upstreams have no configured model, in front of a fake that
    serves two models and refuses others."""
    with FakeUpstreamThread(models=("small-1", "large-2"), strict_models=True) as fake:
        upstream = {"base_url": fake.base_url, "read_timeout_seconds": 2}
        settings = make_settings(
            tmp_path,
            fake.base_url,
            upstreams={
                "open": {"type": "openai", **upstream},
                "claude": {"type": "anthropic", **upstream},
            },
            scenarios={"open": {"upstream": "open"}, "claude": {"upstream": "claude"}},
        )
        with GatewayThread(settings) as gateway:
            yield gateway, fake


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(
    ("path", "scenario", "shape"),
    [
        ("/v1/chat/completions", "open", "openai"),
        ("/v1/messages", "open", "anthropic"),  # translated
        ("/v1/messages", "claude", "anthropic"),
    ],
    ids=["openai", "translated", "anthropic"],
)
def test_an_unknown_model_on_a_passthrough_upstream_is_404_naming_its_models(
    passthrough: tuple[GatewayThread, FakeUpstreamThread],
    path: str,
    scenario: str,
    shape: str,
    stream: bool,
) -> None:
    gateway, fake = passthrough
    headers = {"x-reef-scenario": scenario}
    body = {
        "model": "gpt-4o",
        "max_tokens": 8,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello"}],
    }
    refused = call(gateway.port, "POST", path, body, headers)
    assert refused.status == 404, refused.body
    error = refused.json()
    if shape == "openai":
        assert error["error"]["type"] == "not_found_error"
    else:
        assert error["type"] == "error" and error["error"]["type"] == "not_found_error"
    message = error["error"]["message"]
    assert "'gpt-4o'" in message and "small-1, large-2" in message, message
    record = gateway.store.get_record(refused.headers["x-reef-record-id"])
    assert record.status == "error" and record.request["model"] == "gpt-4o"

    served = call(gateway.port, "POST", path, {**body, "model": "large-2"}, headers)
    assert served.status == 200, served.body
    assert fake.last_request_body["model"] == "large-2"


def test_the_embedded_engine_serves_any_model_name_briefly(tmp_path: Path) -> None:
    """The README's first request, as an app sends it: its own model name, no
    max_tokens. The engine answers with its configured model, at most
    ``DEFAULT_MAX_TOKENS`` tokens long."""
    pytest.importorskip("torch")
    from reef.engine.models import load_model
    from reef.engine.runtime import DEFAULT_MAX_TOKENS, Engine
    from reef.engine.server import BackgroundServer

    engine = BackgroundServer(Engine(load_model("tiny-random", tmp_path), threads=1)).start()
    try:
        settings = make_settings(
            tmp_path,
            engine.base_url,
            upstreams={
                "engine": {"type": "openai", "base_url": engine.base_url, "model": "tiny-random"}
            },
            scenarios={"support": {"upstream": "engine"}},
        )
        with GatewayThread(settings) as gateway:
            client = gateway.openai(**{"x-reef-scenario": "support"})
            completion = client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "My invoice is wrong"}]
            )
            assert completion.usage is not None
            assert 0 < completion.usage.completion_tokens <= DEFAULT_MAX_TOKENS
    finally:
        engine.stop()
