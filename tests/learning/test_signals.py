"""Conversation signals from real sessions: a scripted agent through the official SDKs
(OpenAI and Anthropic dialects) and the gateway in front of the fake upstream; each rule
with a case where it fires and one where it must not."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from reef.experience.trajectories import Trajectory, assemble_trajectory
from reef.learning.signals import Signal, SignalsConfig, observed_vocabulary, session_signals
from tests.experience.agent import Agent, Dialect, Sent
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings

DIALECTS: list[Dialect] = ["openai", "anthropic"]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    home = tmp_path_factory.mktemp("signals")
    with (
        FakeUpstreamThread() as fake,
        GatewayThread(make_settings(Path(home), fake.base_url)) as gateway,
    ):
        yield gateway


def trajectory(agent: Agent, sent: Sent) -> Trajectory:
    records = agent.gateway.store.get_session(agent.scenario, sent.session_id)
    return assemble_trajectory(agent.scenario, sent.session_id, records)


def signals(agent: Agent, sent: Sent, **config: Any) -> list[Signal]:
    return session_signals(trajectory(agent, sent), SignalsConfig(**config))


def kinds(found: list[Signal]) -> list[tuple[str, str]]:
    return [(signal.name, signal.record_id) for signal in found]


def conversation(gateway: GatewayThread, dialect: Dialect, *said: str) -> tuple[Agent, list[Sent]]:
    """The agent's messages ``said`` in turn, each answered (no tools offered)."""
    agent = Agent(gateway, dialect)
    return agent, [agent.user(text).ask(tools=False) for text in said]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_correction_in_the_next_turn_is_extracted(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent, (asked, corrected) = conversation(
        gateway, dialect, f"which team owns the {dialect} widget?", "No, it's T-OPS, not T-POP."
    )
    (signal,) = signals(agent, corrected)
    assert (signal.name, signal.record_id, signal.score) == ("correction", asked.record_id, 0.0)
    assert signal.correction == "T-OPS" and signal.evidence == "No, it's T-OPS, not T-POP."
    assert signal.confidence == 0.7


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_complaint_without_the_answer_is_a_correction_without_one(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent, (asked, complained) = conversation(
        gateway, dialect, f"when does the {dialect} store open?", "that's not what I asked"
    )
    (signal,) = signals(agent, complained)
    assert (signal.name, signal.record_id, signal.correction) == (
        "correction",
        asked.record_id,
        None,
    )


@pytest.mark.parametrize("dialect", DIALECTS)
def test_thanks_accepts_but_thanks_with_a_complaint_does_not(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent, (asked, thanked) = conversation(
        gateway, dialect, f"how do I pay my {dialect} invoice?", "Thanks, that works!"
    )
    assert kinds(signals(agent, thanked)) == [("accept", asked.record_id)]
    assert signals(agent, thanked)[0].score == 1.0
    agent, (asked, mixed) = conversation(
        gateway, dialect, f"how do I close my {dialect} account?", "thanks, but that is wrong"
    )
    assert kinds(signals(agent, mixed)) == [("correction", asked.record_id)]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_asking_again_in_other_words_is_a_rephrase(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent, (asked, again) = conversation(
        gateway,
        dialect,
        f"how do I reset my {dialect} password quickly?",
        f"how can I reset the {dialect} password quickly?",
    )
    assert kinds(signals(agent, again)) == [("rephrase", asked.record_id)]
    # a follow-up on something else is no signal at all
    agent, (_, other) = conversation(
        gateway, dialect, f"how do I reset my {dialect} password?", "and what about billing?"
    )
    assert signals(agent, other) == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_same_request_sent_again_after_an_answer_is_a_retry(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    # (a conversation's first message sent twice starts two sessions: two users may
    # well open alike; a retry later in a conversation continues its session)
    agent = Agent(gateway, dialect)
    agent.user(f"I need help with my {dialect} order").ask(tools=False)
    agent.user("summarise it")
    first = agent.ask(tools=False, keep=False)
    second = agent.ask(tools=False)
    assert first.session_id == second.session_id
    assert kinds(signals(agent, second)) == [("retry", first.record_id)]
    assert signals(agent, second, enabled=["accept"]) == []  # off unless enabled


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_tool_result_reporting_an_error_judges_the_call(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent = Agent(gateway, dialect)
    called = agent.user(f"what is the weather in {dialect}ville?").ask()
    (call,) = called.calls
    answered = agent.results((call, "Error: no such city")).ask()
    (signal,) = signals(agent, answered)
    assert (signal.name, signal.record_id) == ("tool_error", called.record_id)
    assert signal.evidence == "Error: no such city"
    # a JSON error object counts too; a result that merely mentions an error does not
    agent = Agent(gateway, dialect)
    called = agent.user(f"what is the weather in {dialect} city?").ask()
    answered = agent.results((called.calls[0], '{"error": "rate limited"}')).ask()
    assert kinds(signals(agent, answered)) == [("tool_error", called.record_id)]
    agent = Agent(gateway, dialect)
    called = agent.user(f"is the weather in {dialect} town an error?").ask()
    answered = agent.results((called.calls[0], "sunny, no error today")).ask()
    assert signals(agent, answered) == []


def test_abandon_needs_its_timeout_and_no_acceptance(gateway: GatewayThread) -> None:
    agent, (asked,) = conversation(gateway, "openai", "where is my parcel?")
    found = trajectory(agent, asked)
    config = SignalsConfig(enabled=("abandon", "accept"), abandon_after_seconds=600)
    answered_at = found.turns[found.turn_of_record[asked.record_id]].answered.created_at
    assert session_signals(found, config, now=answered_at + timedelta(seconds=599)) == []
    (signal,) = session_signals(found, config, now=answered_at + timedelta(seconds=601))
    assert (signal.name, signal.record_id, signal.confidence) == ("abandon", asked.record_id, 0.3)
    agent, (asked, thanked) = conversation(gateway, "openai", "where is my letter?", "thanks!")
    later = trajectory(agent, thanked)
    leaf = later.turns[later.turn_of_record[thanked.record_id]].answered.created_at
    names = [s.name for s in session_signals(later, config, now=leaf + timedelta(hours=1))]
    assert names == ["accept", "abandon"]  # the thanks itself was left unanswered after


def test_rules_and_confidences_are_configurable_and_checked() -> None:
    config = SignalsConfig(
        complaint_patterns=[r"\bnein\b"],
        correction_patterns=[r"richtig ist (?P<correction>\w+)"],
        confidence={"correction": 0.9},
    )
    assert config.confidence_of("correction") == 0.9 and config.confidence_of("accept") == 0.6
    with pytest.raises(ValidationError, match="not a regular expression"):
        SignalsConfig(accept_patterns=["(unclosed"])
    with pytest.raises(ValidationError, match="correction"):
        SignalsConfig(correction_patterns=[r"it is (\w+)"])
    with pytest.raises(ValidationError, match="must lie in"):
        SignalsConfig(confidence={"accept": 1.5})
    with pytest.raises(ValidationError):
        SignalsConfig(enabled=["telepathy"])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_configured_patterns_replace_the_english_ones(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent, (asked, corrected) = conversation(
        gateway, dialect, f"welches Team hat {dialect}?", "Nein, richtig ist T-OPS."
    )
    assert signals(agent, corrected, complaint_patterns=[r"^no\b"]) == []
    (signal,) = signals(
        agent,
        corrected,
        complaint_patterns=[r"\bnein\b"],
        correction_patterns=[r"richtig ist (?P<correction>[\w-]+)"],
    )
    assert (signal.record_id, signal.correction) == (asked.record_id, "T-OPS")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(
    "said",
    ["My order number is 48213.", "hmm, I think it's actually 48213?", "it should be 48213"],
)
def test_everyday_phrasings_of_a_correction_give_the_value(
    gateway: GatewayThread, dialect: Dialect, said: str
) -> None:
    agent, (asked, corrected) = conversation(
        gateway, dialect, f"extract the {dialect} order number from: order 48213 is late", said
    )
    (signal,) = signals(agent, corrected)
    assert (signal.name, signal.record_id, signal.correction) == (
        "correction",
        asked.record_id,
        "48213",
    )


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_polite_no_and_a_new_request_are_no_correction(
    gateway: GatewayThread, dialect: Dialect
) -> None:
    agent, (asked, closed) = conversation(
        gateway, dialect, f"which {dialect} order is late?", "no, that's all, thanks"
    )
    assert kinds(signals(agent, closed)) == [("accept", asked.record_id)]
    agent, (_, moved_on) = conversation(
        gateway, dialect, f"which {dialect} order is late?", "No. Now check order 555"
    )
    assert signals(agent, moved_on) == []


def test_the_observed_vocabulary_is_the_short_answers_given_twice(gateway: GatewayThread) -> None:
    said = ["billing", "shipping", "billing", "shipping", "refund", "order 4471", "order 4471"]
    found = []
    for text in said:
        agent, (sent,) = conversation(gateway, "openai", text)
        found.append(trajectory(agent, sent))
    # the fake upstream answers "echo: <text>": a label of two words, or one with digits
    assert set(observed_vocabulary(found)) == {"echo: billing", "echo: shipping"}
    assert observed_vocabulary(found, most=1) in (("echo: billing",), ("echo: shipping",))
