"""``server.unknown_scenarios``: ``create`` (the default) makes a scenario on its first
request and logs it once; ``reject`` answers 404 in the route's dialect, naming the
configured scenarios. And ``POST /reef/scenarios/{s}/learn`` refuses (409) a scenario
without a recipe."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import anthropic
import openai
import pytest

from reef.jobs import JobQueue
from reef.releases import ReleaseChain
from tests.gateway.harness import GatewayThread
from tests.gateway.rawhttp import call

REJECT = {"unknown_scenarios": "reject"}
ASK = [{"role": "user", "content": "hello"}]


def test_reject_answers_404_in_the_openai_shape(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(server=REJECT)
    client = gateway.openai()
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="reef/suport", messages=ASK)
    error = caught.value.body
    assert isinstance(error, dict), error
    assert error["type"] == "not_found_error"
    message = error["message"]
    assert "scenario 'suport' is not configured" in message
    assert "server.unknown_scenarios" in message
    assert "'claude', 'support'" in message  # the configured ones, to pick from
    with pytest.raises(openai.NotFoundError):
        misspelled = gateway.openai(**{"x-reef-scenario": "suport"})
        misspelled.chat.completions.create(model="anything", messages=ASK)
    assert [s.name for s in ReleaseChain(gateway.database).scenarios()] == ["claude", "support"]


def test_reject_answers_404_in_the_anthropic_shape(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(server=REJECT)
    client = gateway.anthropic(**{"x-reef-scenario": "claud"})
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-anything", max_tokens=16, messages=ASK)
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "not_found_error"
    assert "scenario 'claud' is not configured" in body["error"]["message"]
    assert "'claude', 'support'" in body["error"]["message"]
    counted = call(
        gateway.port,
        "POST",
        "/v1/messages/count_tokens",
        {"model": "reef/claud", "messages": ASK},
    )
    assert counted.status == 404, counted.body


def test_reject_still_serves_configured_scenarios_and_default(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(server=REJECT)
    client = gateway.openai()
    served = client.chat.completions.with_raw_response.create(model="reef/support", messages=ASK)
    assert gateway.store.get_record(served.headers["x-reef-record-id"]).scenario == "support"
    unnamed = client.chat.completions.with_raw_response.create(model="fake-model", messages=ASK)
    assert gateway.store.get_record(unnamed.headers["x-reef-record-id"]).scenario == "default"


def test_create_makes_the_scenario_and_logs_it_once(
    make_gateway: Callable[..., GatewayThread], caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_gateway()
    client = gateway.openai()
    with caplog.at_level(logging.INFO, logger="reef"):
        for _ in range(3):
            client.chat.completions.create(model="reef/suport", messages=ASK)
        client.chat.completions.create(model="reef/support", messages=ASK)
    created = [r.getMessage() for r in caplog.records if "on first request" in r.getMessage()]
    assert created == [
        "created scenario 'suport' on first request; set server.unknown_scenarios: "
        "reject to refuse misspelled names"
    ]
    assert "suport" in [s.name for s in ReleaseChain(gateway.database).scenarios()]
    listed = call(gateway.port, "GET", "/reef/scenarios").json()["data"]
    configured = {item["name"]: item["configured"] for item in listed}
    assert configured == {"claude": True, "support": True, "suport": False}


def test_learn_without_a_recipe_is_409_naming_the_setting(
    make_gateway: Callable[..., GatewayThread], tmp_path: Path
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("learners: [{type: fewshot, k: 2}]\n")
    gateway = make_gateway(scenarios={"support": {"recipe": recipe}, "claude": {}})
    refused = call(gateway.port, "POST", "/reef/scenarios/claude/learn")
    assert refused.status == 409, refused.body
    error = refused.json()["error"]
    assert error["type"] == "conflict_error"
    assert "scenario 'claude' has no recipe to learn with" in error["message"]
    assert "scenarios.claude.recipe" in error["message"]
    assert JobQueue(gateway.database).list() == []
    queued = call(gateway.port, "POST", "/reef/scenarios/support/learn")
    assert queued.status == 202, queued.body
    [job] = JobQueue(gateway.database).list()
    assert job.id == queued.json()["id"] and job.scenario == "support"


def _names(gateway: GatewayThread) -> list[str]:
    listed = call(gateway.port, "GET", "/reef/scenarios").json()["data"]
    return [item["name"] for item in listed]


def test_a_stray_scenario_that_holds_nothing_can_be_deleted(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway()
    unrecorded = gateway.openai(**{"x-reef-capture": "off"})
    unrecorded.chat.completions.create(model="reef/suport", messages=ASK)
    assert "suport" in _names(gateway)
    deleted = call(gateway.port, "DELETE", "/reef/scenarios/suport")
    assert deleted.status == 200, deleted.body
    assert deleted.json() == {"name": "suport", "deleted": True}
    assert "suport" not in _names(gateway)
    assert ReleaseChain(gateway.database).head("suport") is None
    # Named again, it is created again, and recorded as any scenario is.
    again = gateway.openai().chat.completions.with_raw_response.create(
        model="reef/suport", messages=ASK
    )
    assert gateway.store.get_record(again.headers["x-reef-record-id"]).scenario == "suport"
    assert "suport" in _names(gateway)


def test_deleting_a_scenario_never_drops_experience(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway()
    gateway.openai().chat.completions.create(model="reef/suport", messages=ASK)
    refused = call(gateway.port, "DELETE", "/reef/scenarios/suport")
    assert refused.status == 409, refused.body
    message = refused.json()["error"]["message"]
    assert "scenario 'suport' holds 1 record" in message and "kept" in message
    assert "suport" in _names(gateway)
    configured = call(gateway.port, "DELETE", "/reef/scenarios/support")
    assert configured.status == 409
    assert "scenarios.support" in configured.json()["error"]["message"]
    unknown = call(gateway.port, "DELETE", "/reef/scenarios/never-seen")
    assert unknown.status == 404, unknown.body
    assert "scenario 'never-seen' not found" in unknown.json()["error"]["message"]


def test_reject_lists_no_model_for_an_unconfigured_scenario(
    make_gateway: Callable[..., GatewayThread],
) -> None:
    gateway = make_gateway(server=REJECT)
    client = gateway.openai()
    assert client.models.retrieve("reef/support").id == "reef/support"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("reef/suport")
    created = make_gateway()  # create: any scenario name is a model it serves
    assert created.openai().models.retrieve("reef/suport").id == "reef/suport"
