"""The reflector is the scenario's own model unless a learner names another one."""

from __future__ import annotations

import pytest

from reef.config import ReefSettings
from reef.learning.reflect import ReflectError, make_reflect
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
        reflect = make_reflect(settings, "s", upstream_name="big", model="judge-xl")
        answer = reflect([{"role": "user", "content": "revise the rules"}])
        assert "revise the rules" in answer
        assert fake.last_request_body["model"] == "judge-xl"
        default_model = make_reflect(settings, "s", upstream_name="big")
        default_model([{"role": "user", "content": "again"}])
        assert fake.last_request_body["model"] == "big-default"
    with pytest.raises(ReflectError, match="not configured"):
        make_reflect(settings, "s", upstream_name="nope")


def test_every_learner_accepts_the_reflector_settings() -> None:
    registry = LearnerRegistry()
    for name in ("fewshot", "instructions", "skills"):
        config = registry.get(name).config_model.model_validate(
            {"reflector_upstream": "big", "reflector_model": "judge-xl"}
        )
        assert config.reflector_model == "judge-xl"
