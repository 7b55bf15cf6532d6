"""Progressive rollout of a distilled student (``reef.evaluation.rollout``) on a real
release chain in SQLite: each promoted step starts the next share as a canary beside the
new head, and a drop rolls the scenario back to its teacher release in one step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.db import open_database
from reef.evaluation.rollout import advance, back_to_teacher, next_share, teacher_release
from reef.releases import (
    ModelComponent,
    ReleaseChain,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
)

STEPS = [0.1, 0.5, 1.0]


def manifest(share: float) -> ReleaseManifest:
    routing = RoutingComponent(
        student_share=share, teacher=TeacherEndpoint(upstream="teacher", model="big")
    )
    return ReleaseManifest(model=ModelComponent(base="small"), routing=routing)


@pytest.fixture
def chain(tmp_path: Path) -> Iterator[ReleaseChain]:
    database = open_database(f"sqlite:///{tmp_path / 'reef.db'}")
    yield ReleaseChain(database)
    database.close()


def _canary(chain: ReleaseChain, share: float) -> tuple[str, str]:
    """A student candidate at ``share`` live as a canary beside the head; (its id, the
    head's id)."""
    head = chain.head("support")
    assert head is not None
    candidate = chain.propose("support", manifest(share), head.id, "test", "student")
    chain.set_candidate_state(candidate.id, "evaluating")
    evidence = {"gate": {"baseline_id": head.id}}
    chain.set_candidate_state(candidate.id, "passed", evidence)
    chain.start_canary(candidate.id, 0.25, "test", "step", {"min_requests": 7})
    return candidate.id, head.id


def test_next_share_walks_the_steps() -> None:
    assert next_share(0.0, STEPS) == 0.1
    assert next_share(0.1, STEPS) == 0.5
    assert next_share(0.3, STEPS) == 0.5
    assert next_share(1.0, STEPS) is None


def test_each_promoted_step_starts_the_next_until_the_last(chain: ReleaseChain) -> None:
    chain.create("support", manifest(0.0), "test", "first release: the teacher")
    candidate_id, head_id = _canary(chain, 0.1)
    shares = []
    while True:
        release = chain.publish(candidate_id, head_id, "canary", "promoted", operation="promote")
        promoted = chain.get_candidate(candidate_id)
        routing = release.manifest.routing
        assert routing is not None
        shares.append(routing.student_share)
        started = advance(chain, promoted, release, STEPS)
        if started is None:
            break
        assert started.state == "canary"
        canary = (started.evidence or {})["canary"]
        assert canary["fraction"] == 0.25 and canary["min_requests"] == 7
        assert (started.evidence or {})["gate"]["baseline_id"] == release.id
        assert chain.canaries()["support"].id == started.id
        candidate_id, head_id = started.id, release.id
    assert shares == [0.1, 0.5, 1.0]
    assert chain.canaries() == {}


def test_a_drop_rolls_back_to_the_teacher_release(chain: ReleaseChain) -> None:
    teacher = chain.create("support", manifest(0.0), "test", "first release: the teacher")
    first_id, head_id = _canary(chain, 0.1)
    release = chain.publish(first_id, head_id, "canary", "promoted", operation="promote")
    started = advance(chain, chain.get_candidate(first_id), release, STEPS)
    assert started is not None
    chain.set_candidate_state(started.id, "abandoned")
    assert teacher_release(chain, "support") == teacher
    rollback = back_to_teacher(chain, chain.get_candidate(started.id), "worse live")
    assert rollback is not None and rollback.operation == "rollback"
    head = chain.head("support")
    assert head is not None and head.id == rollback.id
    assert head.manifest == teacher.manifest  # share 0: the teacher answers everything
    # at share 0 already: nothing more to roll back
    assert back_to_teacher(chain, chain.get_candidate(started.id), "again") is None


def test_nothing_advances_or_rolls_back_without_routing(chain: ReleaseChain) -> None:
    plain = ReleaseManifest(model=ModelComponent(base="small"))
    head = chain.create("support", plain, "test", "first")
    candidate = chain.propose("support", plain, head.id, "test", "plain")
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed")
    release = chain.publish(candidate.id, head.id, "test", "published")
    promoted = chain.get_candidate(candidate.id)
    assert advance(chain, promoted, release, STEPS) is None
    assert back_to_teacher(chain, promoted, "worse") is None
    assert teacher_release(chain, "support") is None
