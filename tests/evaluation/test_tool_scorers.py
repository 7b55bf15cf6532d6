"""The ``tool_call`` and ``turn`` scorers, and held-out tool-using turns replayed through
the gate's runner: a real gateway in front of the fake upstream (which calls the
weather tool for Paris), a correction naming Rome, and the scores each replay earns."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.evaluation.decision import score_answers
from reef.evaluation.runner import GatewayTarget, collect_answers, parse_reply
from reef.evaluation.scorers import ScorerContext, ScorerError, ScorerRegistry, build_scorer
from reef.evaluation.values import EvalItem, Reply
from reef.learning.holdout import holdout_items
from reef.learning.recipes import parse_recipe
from reef.releases import ReleaseChain
from tests.experience.agent import Agent
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call


def openai_call(name: str, arguments: Any, call_id: str = "call_1") -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def item(reference: Any, scorer: str = "tool_call") -> EvalItem:
    return EvalItem(
        id="i", suite="file:t", messages=[], reference=reference, scorer={"type": scorer}
    )


def score(spec: dict[str, Any], reference: Any, *calls: dict[str, Any], text: str = "") -> float:
    scorer = build_scorer(spec)
    return scorer.score_reply(Reply(text, text, tuple(calls)), item(reference)).score


ROME = {"tool_calls": [{"name": "get_weather", "arguments": '{"city": "Rome", "days": 3}'}]}


@pytest.mark.parametrize(
    "reply_call",
    [
        openai_call("get_weather", {"days": 3, "city": "Rome"}),  # key order
        openai_call("get_weather", '{ "city":"Rome",\n "days": 3.0 }'),  # spacing, 3 == 3.0
        {"name": "get_weather", "arguments": {"city": "Rome", "days": 3}},  # short form
        {
            "type": "tool_use",
            "id": "t",
            "name": "get_weather",
            "input": {"city": "Rome", "days": 3},
        },
    ],
)
def test_equal_calls_score_one_in_any_form(reply_call: dict[str, Any]) -> None:
    assert score({"type": "tool_call"}, ROME, reply_call) == 1.0


@pytest.mark.parametrize(
    "reply_call",
    [
        openai_call("get_weather", {"city": "Paris", "days": 3}),  # a wrong argument
        openai_call("get_forecast", {"city": "Rome", "days": 3}),  # a wrong function
        openai_call("get_weather", {"city": "Rome"}),  # an argument missing
        openai_call("get_weather", {"city": "Rome", "days": 3, "units": "C"}),  # one extra
        openai_call("get_weather", {"city": "Rome", "days": True}),  # true is not a number
        openai_call("get_weather", "{not json"),  # unparseable arguments
    ],
)
def test_different_calls_score_zero(reply_call: dict[str, Any]) -> None:
    assert score({"type": "tool_call"}, ROME, reply_call) == 0.0


def test_a_reply_without_calls_or_with_more_calls_scores_zero() -> None:
    right = openai_call("get_weather", {"city": "Rome", "days": 3})
    assert score({"type": "tool_call"}, ROME, text="It is sunny in Rome.") == 0.0
    assert score({"type": "tool_call"}, ROME, right, right) == 0.0
    assert score({"type": "tool_call", "partial": True}, ROME, right, right) == 0.5


def test_argument_rules_order_and_partial_credit() -> None:
    loose = {"type": "tool_call", "arguments": {"city": "normalized", "days": "ignore"}}
    assert score(loose, ROME, openai_call("get_weather", {"city": "  rome ", "days": 9})) == 1.0
    number = {"type": "tool_call", "arguments": {"days": "number"}, "tolerance": 0.01}
    assert score(number, ROME, openai_call("get_weather", {"city": "Rome", "days": "3.001"})) == 1.0
    extra = {"type": "tool_call", "extra_arguments": True}
    wider = openai_call("get_weather", {"city": "Rome", "days": 3, "units": "C"})
    assert score(extra, ROME, wider) == 1.0
    both = [{"name": "a", "arguments": "{}"}, {"name": "b", "arguments": "{}"}]
    swapped = (openai_call("b", {}), openai_call("a", {}))
    assert score({"type": "tool_call"}, both, *swapped) == 1.0  # parallel calls: any order
    assert score({"type": "tool_call", "order": "strict"}, both, *swapped) == 0.0
    half = {"type": "tool_call", "partial": True}
    assert score(half, both, openai_call("a", {}), openai_call("c", {})) == 0.5


def test_the_score_shows_what_was_expected_and_got() -> None:
    scorer = build_scorer({"type": "tool_call"})
    result = scorer.score_reply(
        Reply("", "", (openai_call("get_weather", {"city": "Paris"}),)), item(ROME)
    )
    assert result.score == 0.0
    assert result.details["expected"] == [
        {"name": "get_weather", "arguments": {"city": "Rome", "days": 3}}
    ]
    assert result.details["got"] == [{"name": "get_weather", "arguments": {"city": "Paris"}}]


def test_a_text_reference_is_a_misconfiguration_for_tool_call() -> None:
    with pytest.raises(ScorerError, match="reference of tool calls"):
        score({"type": "tool_call"}, "sunny", openai_call("get_weather", {}))


def test_turn_scores_text_or_calls_whichever_the_reference_is() -> None:
    right = openai_call("get_weather", {"city": "Rome", "days": 3})
    assert score({"type": "turn"}, ROME, right) == 1.0
    assert score({"type": "turn"}, "It is sunny.", text="it is SUNNY") == 1.0
    # a call where text was expected is wrong, whatever its text scorer says
    assert score({"type": "turn", "text": "contains"}, "sunny", right, text="sunny") == 0.0
    assert score({"type": "turn", "text": {"type": "exact"}}, "Sunny", text="sunny") == 0.0
    with pytest.raises(ScorerError, match="cannot be 'turn'"):
        build_scorer({"type": "turn", "text": "turn"})


def test_the_text_form_of_a_reply_scores_like_the_reply() -> None:
    """``score(text)`` (a reply as the runner writes it, calls as its last JSON line)."""
    data = {"choices": [{"message": {"content": "Let me look.", "tool_calls": [
        openai_call("get_weather", {"city": "Rome", "days": 3})
    ]}}]}  # fmt: skip
    reply = parse_reply(data)
    assert reply.content == "Let me look." and len(reply.tool_calls) == 1
    scorer = build_scorer({"type": "tool_call"})
    assert scorer.score(reply.text, item(ROME)).score == 1.0
    assert scorer.score("Let me look.", item(ROME)).score == 0.0


def test_the_registry_knows_both() -> None:
    assert {"tool_call", "turn"} <= set(ScorerRegistry().known())


# -- held-out tool-using turns, replayed through the gateway ---------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayThread]:
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(tmp_path, fake.base_url)) as gateway,
    ):
        yield gateway


def test_held_out_tool_turns_are_replayed_with_their_tools_and_scored_by_call(
    gateway: GatewayThread,
) -> None:
    corrected = Agent(gateway, "openai").user("what is the weather in Rome?").ask()
    approved = Agent(gateway, "openai").user("what is the weather today?").ask()
    assert corrected.calls and approved.calls  # the fake called the tool for Paris
    assert corrected.session_id != approved.session_id
    rome = {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    feedback = [
        {"record_ids": [corrected.record_id], "score": 0, "correction": {"tool_calls": [rome]}},
        {"record_ids": [approved.record_id], "score": 1},
    ]
    for body in feedback:
        sent = call(gateway.port, "POST", "/reef/feedback", body, {"x-reef-scenario": "support"})
        assert sent.status == 201, sent.body
    chain = ReleaseChain(gateway.database)
    recipe = parse_recipe({"learners": [{"type": "fewshot"}], "selection": {"holdout_fraction": 1}})
    items = {i.id: i for i in holdout_items(gateway.store, chain, "support", recipe)}
    assert set(items) == {corrected.record_id, approved.record_id}
    for held in items.values():
        assert held.scorer == {"type": "tool_call"}
        assert [t["function"]["name"] for t in held.params["tools"]] == ["get_weather"]
    # the correction as stored: canonical, its arguments compact JSON
    canonical = {"name": "get_weather", "arguments": '{"city":"Rome"}'}
    assert items[corrected.record_id].reference == {"tool_calls": [canonical]}
    assert items[approved.record_id].reference["tool_calls"][0]["name"] == "get_weather"

    head = chain.head("support")
    assert head is not None
    candidate = chain.propose("support", head.manifest, head.id, "test", "replay")
    answers = collect_answers(
        GatewayTarget(base_url=gateway.url, scenario="support"),
        list(items.values()),
        {"candidate": candidate.id, "baseline": head.id},
    )
    assert all(answer.tool_calls for answer in answers)  # the tools were offered again
    results = score_answers(
        list(items.values()), answers, {"type": "exact"}, ScorerRegistry(), ScorerContext(), 40
    )
    by_item = {(r.item_key, r.arm): r.score for r in results}
    for arm in ("candidate", "baseline"):
        assert by_item[(f"holdout/{corrected.record_id}", arm)] == 0.0  # Paris, not Rome
        assert by_item[(f"holdout/{approved.record_id}", arm)] == 1.0
