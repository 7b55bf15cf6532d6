"""The reflector is the scenario's own model unless a learner names another one."""

from __future__ import annotations

import asyncio

import pytest

from reef.config import ReefSettings
from reef.learning.reflect import ReflectError, UpstreamReflector
from reef.learning.registry import LearnerRegistry
from tests.fakes.upstream import FakeUpstreamThread


def test_reflector_upstream_and_model_are_chosen_by_the_learner() -> None:
    with FakeUpstreamThread() as fake:
        settings = ReefSettings(
            upstreams={
                "serving": {
                    "type": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "small",
                },
                "big": {"type": "openai", "base_url": fake.base_url, "model": "big-default"},
            },
            scenarios={"s": {"upstream": "serving"}},
        )
        reflector = UpstreamReflector(settings, "s", upstream_name="big", model="judge-xl")
        answer = reflector.reflect([{"role": "user", "content": "revise the rules"}])
        assert "revise the rules" in answer
        assert fake.last_request_body["model"] == "judge-xl"
        default_model = UpstreamReflector(settings, "s", upstream_name="big")
        default_model.reflect([{"role": "user", "content": "again"}])
        assert fake.last_request_body["model"] == "big-default"
    with pytest.raises(ReflectError, match="not configured"):
        UpstreamReflector(settings, "s", upstream_name="nope")


def test_every_learner_accepts_the_reflector_settings() -> None:
    registry = LearnerRegistry()
    for name in ("fewshot", "instructions", "skills"):
        config = registry.get(name).config_model.model_validate(
            {"reflector_upstream": "big", "reflector_model": "judge-xl"}
        )
        assert config.reflector_model == "judge-xl"


def test_an_anthropic_reflector_speaks_messages_with_its_key() -> None:
    with FakeUpstreamThread(api_key="sk-ant-test") as fake:
        settings = ReefSettings(
            upstreams={
                "claude": {
                    "type": "anthropic",
                    "base_url": fake.base_url,
                    "model": "claude-x",
                    "api_key": "sk-ant-test",
                }
            },
            scenarios={"s": {"upstream": "claude"}},
        )
        answer = UpstreamReflector(settings, "s").reflect(
            [
                {"role": "system", "content": "You revise rules."},
                {"role": "user", "content": "revise the rules"},
            ]
        )
    assert "revise the rules" in answer
    assert fake.last_request_path == "/v1/messages"
    assert fake.last_request_body["system"] == "You revise rules."
    assert [m["role"] for m in fake.last_request_body["messages"]] == ["user"]
    assert fake.last_request_headers["x-api-key"] == "sk-ant-test"
    assert "anthropic-version" in fake.last_request_headers


def test_a_local_reflector_uses_the_workers_url_and_works_inside_an_event_loop() -> None:
    settings = ReefSettings(
        upstreams={"engine": {"type": "local", "model": "tiny"}},
        scenarios={"s": {"upstream": "engine"}},
    )
    with pytest.raises(ReflectError, match="no base_url"):
        UpstreamReflector(settings, "s").reflect([{"role": "user", "content": "x"}])
    with FakeUpstreamThread() as fake:
        reflector = UpstreamReflector(settings, "s", base_url=fake.base_url)

        async def from_async_code() -> str:
            return reflector.reflect([{"role": "user", "content": "inside a loop"}])

        assert "inside a loop" in asyncio.run(from_async_code())
    assert fake.last_request_body["model"] == "tiny"


def test_an_unreachable_reflector_is_a_reflect_error_naming_it() -> None:
    settings = ReefSettings(
        upstreams={
            "gone": {
                "type": "openai",
                "base_url": "http://127.0.0.1:9/v1",
                "model": "m",
                "connect_timeout_seconds": 0.5,
                "max_retries": 0,
            }
        },
        scenarios={"s": {"upstream": "gone"}},
    )
    with pytest.raises(
        ReflectError, match=r"reflector at http://127\.0\.0\.1:9/v1/chat/completions"
    ):
        UpstreamReflector(settings, "s").reflect([{"role": "user", "content": "x"}])
