"""Canaries on both backends: passed → canary → published | abandoned, at most one live
canary per scenario (also under a race), ``canaries()``, and gc keeping their artifacts."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import pytest

import reef.releases.chain as chain_module
from reef.core.errors import InvalidInputError
from reef.releases import (
    Candidate,
    InvalidTransitionError,
    Release,
    ReleaseChain,
    ScenarioHasNoReleaseError,
)
from tests.releases.conftest import ManifestFactory, digest

RACERS = 6


def passed(
    chain: ReleaseChain, parent: Release, adapter: int, manifest: ManifestFactory
) -> Candidate:
    candidate = chain.propose(parent.scenario, manifest(adapter=adapter), parent.id, "w", "job")
    chain.set_candidate_state(candidate.id, "evaluating")
    return chain.set_candidate_state(candidate.id, "passed", evidence={"win_rate": 0.7})


def test_start_canary_merges_its_settings_into_the_evidence(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = passed(chain, root, 1, manifest)
    canary = chain.start_canary(
        candidate.id, 0.25, "worker:1", "gate passed", settings={"min_feedback": 40}
    )
    assert canary.state == "canary"
    assert canary.updated_at >= candidate.updated_at
    assert canary.evidence is not None
    assert canary.evidence["win_rate"] == 0.7  # the gate's evidence is kept
    settings = dict(canary.evidence["canary"])
    started = datetime.fromisoformat(settings.pop("started_at"))
    assert started.tzinfo is not None
    assert settings == {
        "fraction": 0.25,
        "actor": "worker:1",
        "reason": "gate passed",
        "min_feedback": 40,
    }
    assert canary.canary_fraction == 0.25
    assert candidate.canary_fraction is None  # only a live canary has one
    assert chain.get_candidate(candidate.id) == canary


def test_only_passed_candidates_start_a_canary_and_only_start_canary_does(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    pending = chain.propose("s", manifest(adapter=1), root.id, "w", "r")
    with pytest.raises(InvalidTransitionError):
        chain.start_canary(pending.id, 0.5, "a", "not evaluated")
    candidate = passed(chain, root, 2, manifest)
    with pytest.raises(InvalidTransitionError, match="start_canary"):
        chain.set_candidate_state(candidate.id, "canary")
    chain.start_canary(candidate.id, 0.5, "a", "r")
    with pytest.raises(InvalidTransitionError):
        chain.start_canary(candidate.id, 0.5, "a", "again")
    for illegal in ("pending", "evaluating", "passed", "rejected"):
        with pytest.raises(InvalidTransitionError):
            chain.set_candidate_state(candidate.id, illegal)  # type: ignore[arg-type]
    assert chain.get_candidate(candidate.id).state == "canary"


@pytest.mark.parametrize("fraction", [0, 0.0, 1, 1.0, -0.1, 1.5, float("nan"), True, "0.5"])
def test_fraction_must_be_strictly_between_0_and_1(
    chain: ReleaseChain, manifest: ManifestFactory, fraction: Any
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = passed(chain, root, 1, manifest)
    with pytest.raises(InvalidInputError):
        chain.start_canary(candidate.id, fraction, "a", "r")
    assert chain.get_candidate(candidate.id).state == "passed"


def test_settings_cannot_override_what_start_canary_records(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = passed(chain, root, 1, manifest)
    with pytest.raises(InvalidInputError, match="fraction"):
        chain.start_canary(candidate.id, 0.5, "a", "r", settings={"fraction": 0.9})
    with pytest.raises(InvalidInputError):
        chain.start_canary(candidate.id, 0.5, "a", "r", settings={"x": object()})
    assert chain.get_candidate(candidate.id).state == "passed"


def test_a_canary_needs_a_head(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    candidate = chain.propose("headless", manifest(adapter=1), None, "w", "r")
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed")
    with pytest.raises(ScenarioHasNoReleaseError):
        chain.start_canary(candidate.id, 0.5, "a", "r")


def test_one_live_canary_per_scenario_and_canaries_lists_them(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    other = chain.create("t", manifest(), "config", "init")
    assert chain.canaries() == {}
    first = chain.start_canary(passed(chain, root, 1, manifest).id, 0.1, "a", "r")
    second = passed(chain, root, 2, manifest)
    with pytest.raises(InvalidTransitionError, match=first.id):
        chain.start_canary(second.id, 0.2, "a", "r")
    assert chain.get_candidate(second.id).state == "passed"
    elsewhere = chain.start_canary(passed(chain, other, 3, manifest).id, 0.3, "a", "r")
    assert chain.canaries() == {"s": first, "t": elsewhere}

    chain.set_candidate_state(first.id, "abandoned")
    assert chain.canaries() == {"t": elsewhere}
    replacement = chain.start_canary(second.id, 0.2, "a", "the first one lost")
    assert chain.canaries() == {"s": replacement, "t": elsewhere}


def test_publishing_a_canary_promotes_it_and_ends_it(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    canary = chain.start_canary(passed(chain, root, 1, manifest).id, 0.5, "a", "r")
    release = chain.publish(canary.id, root.id, "monitor", "canary won")
    assert (release.seq, release.parent_id, release.candidate_id) == (2, root.id, canary.id)
    assert release.evidence == canary.evidence  # defaults to the candidate's, canary included
    assert chain.head("s") == release
    assert chain.get_candidate(canary.id).state == "published"
    assert chain.canaries() == {}
    # review mode promotes a canary too, with evidence of its own
    again = chain.start_canary(passed(chain, release, 2, manifest).id, 0.5, "a", "r")
    promoted = chain.promote(again.id, release.id, "admin:ops", "looked fine", {"live": 0.9})
    assert (promoted.operation, promoted.evidence) == ("promote", {"live": 0.9})
    assert chain.canaries() == {}


def test_abandoning_a_canary_ends_it(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    root = chain.create("s", manifest(), "config", "init")
    canary = chain.start_canary(passed(chain, root, 1, manifest).id, 0.5, "a", "r")
    verdict = {**(canary.evidence or {}), "live": {"verdict": "worse"}}
    abandoned = chain.set_candidate_state(canary.id, "abandoned", verdict)
    assert (abandoned.state, abandoned.evidence) == ("abandoned", verdict)
    assert abandoned.canary_fraction is None
    assert chain.canaries() == {}
    assert chain.head("s") == root
    with pytest.raises(InvalidTransitionError):
        chain.publish(canary.id, root.id, "monitor", "too late")


def test_gc_keeps_a_live_canary_s_artifacts(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = chain.propose("s", manifest(adapter=1, harness=2), root.id, "w", "r")
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed")
    chain.start_canary(candidate.id, 0.5, "a", "r")
    assert chain.reachable_artifacts() == {digest(1), digest(2)}
    chain.set_candidate_state(candidate.id, "abandoned")
    assert chain.reachable_artifacts() == set()


def test_concurrent_canary_starts_in_one_scenario_leave_exactly_one(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    contenders = [passed(chain, root, n, manifest) for n in range(RACERS)]
    barrier = threading.Barrier(RACERS)
    outcomes: list[str] = ["" for _ in range(RACERS)]

    def racer(n: int) -> None:
        barrier.wait()
        try:
            chain.start_canary(contenders[n].id, 0.5, f"w{n}", "race")
            outcomes[n] = "won"
        except InvalidTransitionError:
            outcomes[n] = "refused"
        except Exception as error:
            outcomes[n] = repr(error)

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["refused"] * (RACERS - 1) + ["won"]
    winner = contenders[outcomes.index("won")].id
    assert [c.id for c in chain.candidates("s", state="canary")] == [winner]
    assert chain.canaries()["s"].id == winner


def test_a_canary_start_waits_for_one_in_progress(
    chain: ReleaseChain, manifest: ManifestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forces the interleaving a race needs: the first starter, having found no live
    canary, holds its transaction open until the second has checked too (or a second
    passes). Without the per-scenario lock both would find none and both would win."""
    root = chain.create("s", manifest(), "config", "init")
    contenders = [passed(chain, root, n, manifest) for n in range(2)]
    real = chain_module.live_canary_id
    arrivals: list[str | None] = []
    second_checked = threading.Event()

    def interleaved(conn: Any, scenario: str) -> str | None:
        found = real(conn, scenario)
        arrivals.append(found)
        if len(arrivals) == 1:
            second_checked.wait(timeout=1.0)
        else:
            second_checked.set()
        return found

    monkeypatch.setattr(chain_module, "live_canary_id", interleaved)
    outcomes: list[str] = ["", ""]

    def racer(n: int) -> None:
        try:
            chain.start_canary(contenders[n].id, 0.5, f"w{n}", "race")
            outcomes[n] = "won"
        except InvalidTransitionError:
            outcomes[n] = "refused"

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["refused", "won"]
    assert arrivals[0] is None and arrivals[1] is not None  # the second saw the first's
    assert len(chain.candidates("s", state="canary")) == 1
