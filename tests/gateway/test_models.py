"""An application keeps its own model name: a scenario with a configured model serves
whatever name the client sends and records the request as sent; on an upstream with no
configured model the client's name goes upstream, and one it does not serve is a 404
naming the models it does."""

from __future__ import annotations

from pathlib import Path

import openai
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


@pytest.fixture
def aliased(tmp_path: Path, fake: FakeUpstreamThread) -> object:
    """A gateway whose ``support`` scenario answers to the model name ``support-agent``,
    and whose ``bare`` scenario (an upstream without a configured model) to ``bare-agent``."""
    settings = make_settings(
        tmp_path,
        fake.base_url,
        upstreams={
            "fake": {"type": "openai", "base_url": fake.base_url, "model": "fake-model"},
            "bare": {"type": "openai", "base_url": fake.base_url},
        },
        scenarios={
            "support": {"upstream": "fake", "model_aliases": ["support-agent"]},
            "bare": {"upstream": "bare", "model_aliases": ["bare-agent"]},
        },
    )
    with GatewayThread(settings) as gateway:
        yield gateway


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_a_model_alias_chooses_its_scenario_without_a_header(
    aliased: GatewayThread, fake: FakeUpstreamThread, dialect: str, stream: bool
) -> None:
    """An SDK that refuses ``reef/<scenario>`` (the OpenAI Agents SDK: "Unknown prefix")
    names the scenario's alias instead; no header needed."""
    client = aliased.openai() if dialect == "openai" else aliased.anthropic()
    reply = turn(client, "aliased question", stream=stream, headers={}, model="support-agent")
    assert reply.status == 200 and "aliased question" in reply.text
    assert fake.last_request_body["model"] == "fake-model"
    record = aliased.store.get_record(reply.receipt or "")
    assert record.scenario == "support" and record.request["model"] == "support-agent"


def test_a_model_alias_chooses_its_scenario_on_the_responses_route(
    aliased: GatewayThread, fake: FakeUpstreamThread
) -> None:
    raw = aliased.openai().responses.with_raw_response.create(
        model="support-agent", input="aliased response"
    )
    response = raw.parse()
    assert response.output_text == "echo: aliased response"
    assert response.model == "support-agent"  # the client's name, echoed
    assert fake.last_request_body["model"] == "fake-model"
    record = aliased.store.get_record(raw.headers["x-reef-record-id"])
    assert record.scenario == "support" and record.api == "openai.responses"


def test_model_aliases_are_listed_with_the_scenarios(aliased: GatewayThread) -> None:
    listed = [model.id for model in aliased.openai().models.list()]
    assert {"reef/support", "support-agent", "reef/bare", "bare-agent"} <= set(listed)


def test_an_alias_and_a_header_naming_other_scenarios_is_400_naming_both(
    aliased: GatewayThread, fake: FakeUpstreamThread
) -> None:
    fake.reset()
    body = {"model": "support-agent", "messages": [{"role": "user", "content": "hi"}]}
    refused = call(aliased.port, "POST", "/v1/chat/completions", body, {"x-reef-scenario": "bare"})
    assert refused.status == 400, refused.body
    message = refused.json()["error"]["message"]
    assert "alias of scenario 'support'" in message and "names 'bare'" in message, message
    assert fake.requests_received("/v1/chat/completions") == 0
    # the header naming the alias's own scenario is fine
    agreed = call(
        aliased.port, "POST", "/v1/chat/completions", body, {"x-reef-scenario": "support"}
    )
    assert agreed.status == 200, agreed.body


def test_an_alias_of_a_scenario_without_a_model_is_400_naming_the_setting(
    aliased: GatewayThread, fake: FakeUpstreamThread
) -> None:
    """An alias is never sent upstream as a model name."""
    fake.reset()
    body = {"model": "bare-agent", "input": "hi"}
    refused = call(aliased.port, "POST", "/v1/responses", body)
    assert refused.status == 400, refused.body
    message = refused.json()["error"]["message"]
    assert "scenarios.bare.model" in message and "'bare-agent'" in message, message
    assert fake.requests_received("/v1/chat/completions") == 0


def test_a_model_is_retrieved_by_its_id(aliased: GatewayThread) -> None:
    client = aliased.openai()
    for name in ("reef/support", "reef/unlisted-scenario", "support-agent", "fake-model"):
        model = client.models.retrieve(name)
        assert model.id == name and model.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-nope")
    message = info.value.body["message"]  # type: ignore[index]
    assert "'gpt-nope'" in message and "model_aliases" in message, message


def test_a_scenario_the_key_may_not_use_is_no_model_of_it(
    tmp_path: Path, fake: FakeUpstreamThread
) -> None:
    keys = {"keys": [{"id": "s", "key": "sk-s", "role": "inference", "scenarios": ["support"]}]}
    settings = make_settings(tmp_path, fake.base_url, auth=keys)
    with GatewayThread(settings) as gateway:
        client = gateway.openai(api_key="sk-s")
        assert client.models.retrieve("reef/support").id == "reef/support"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("reef/claude")
