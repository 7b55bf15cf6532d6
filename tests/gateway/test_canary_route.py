"""The canary arm rule: a keyed hash of the session id, below the fraction."""

from __future__ import annotations

from reef.gateway.serving.canary_arm import CanaryRoute
from reef.gateway.serving.release import ServingRelease

SESSIONS = [f"session-{n}" for n in range(20_000)]


def route(candidate_id: str, fraction: float) -> CanaryRoute:
    serving = ServingRelease(
        scenario="s",
        release_id=candidate_id,
        base_model="m",
        adapter_name=None,
        adapter_digest=None,
        harness=None,
        harness_digest=None,
        bundle_digest=None,
        upstream="fake",
    )
    return CanaryRoute(candidate_id, fraction, serving)


def test_the_share_of_sessions_taken_is_the_fraction() -> None:
    for fraction in (0.05, 0.3, 0.5, 0.9):
        taken = sum(route("cand-1", fraction).takes(s) for s in SESSIONS) / len(SESSIONS)
        assert abs(taken - fraction) < 0.02, (fraction, taken)


def test_a_session_always_gets_the_same_answer_from_one_canary() -> None:
    first, second = route("cand-1", 0.5), route("cand-1", 0.5)
    assert [first.takes(s) for s in SESSIONS[:500]] == [second.takes(s) for s in SESSIONS[:500]]


def test_each_canary_samples_its_own_sessions() -> None:
    one = {s for s in SESSIONS if route("cand-1", 0.5).takes(s)}
    other = {s for s in SESSIONS if route("cand-2", 0.5).takes(s)}
    overlap = len(one & other) / len(SESSIONS)
    assert abs(overlap - 0.25) < 0.02  # independent draws, not the same half again


def test_a_larger_fraction_of_the_same_canary_keeps_every_session_it_took() -> None:
    small = {s for s in SESSIONS if route("cand-1", 0.2).takes(s)}
    large = {s for s in SESSIONS if route("cand-1", 0.6).takes(s)}
    assert small <= large
