"""The release chain on both backends: operations, audit fields, conflicts, lifecycle."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

import reef.releases.chain as chain_module
from reef.core.errors import ConflictError, InvalidInputError, NotFoundError
from reef.db.schema import candidates as candidates_table
from reef.db.schema import releases as releases_table
from reef.releases import (
    Candidate,
    CandidateNotFoundError,
    InvalidTransitionError,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseConflictError,
    ReleaseManifest,
    ReleaseNotFoundError,
    ScenarioHasNoReleaseError,
)
from tests.releases.conftest import ManifestFactory, digest


def passed_candidate(
    chain: ReleaseChain, parent: Release, manifest: ReleaseManifest, **evidence: Any
) -> Candidate:
    candidate = chain.propose(parent.scenario, manifest, parent.id, "worker:1", "job 7")
    chain.set_candidate_state(candidate.id, "evaluating")
    return chain.set_candidate_state(candidate.id, "passed", evidence=evidence or {"win": 0.7})


def test_create_makes_the_first_release_and_is_idempotent(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    assert chain.head("s") is None
    first = chain.create("s", manifest(harness=1), "config", "scenario s configured")
    assert (first.seq, first.operation, first.parent_id) == (1, "create", None)
    assert (first.created_by, first.reason) == ("config", "scenario s configured")
    again = chain.create("s", manifest(adapter=9), "someone", "again")
    assert again == first
    assert chain.head("s") == first
    assert [r.id for r in chain.releases("s")] == [first.id]
    assert chain.heads_snapshot() == {"s": (first.id, 1)}


def test_publish_appends_records_who_why_evidence_and_moves_the_head(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = passed_candidate(chain, root, manifest(adapter=1, harness=2), win_rate=0.8)
    assert candidate.evidence == {"win_rate": 0.8}
    release = chain.publish(candidate.id, root.id, "worker:1", "gate passed")
    assert (release.seq, release.parent_id, release.operation) == (2, root.id, "learn")
    assert (release.created_by, release.reason) == ("worker:1", "gate passed")
    assert release.evidence == {"win_rate": 0.8}  # defaults to the candidate's evidence
    assert release.candidate_id == candidate.id
    assert release.manifest == candidate.manifest
    assert chain.get_release(release.id) == release
    assert chain.head("s") == release
    assert chain.get_candidate(candidate.id).state == "published"
    assert release.manifest_json() == {
        "schema_version": 1,
        "model": {"base": "tiny-llama", "adapter": digest(1)},
        "harness": digest(2),
        "recipe": "test-recipe",
        "parent": root.id,
        "operation": "learn",
    }


def test_published_candidate_ids_name_only_the_scenarios_published_candidates(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    chain.create("other", manifest(), "config", "init")
    published = passed_candidate(chain, root, manifest(adapter=1))
    waiting = passed_candidate(chain, root, manifest(adapter=2))
    elsewhere = passed_candidate(chain, chain.head("other"), manifest(adapter=3))
    assert chain.published_candidate_ids("s") == set()
    chain.publish(published.id, root.id, "w", "r")
    assert chain.published_candidate_ids("s") == {published.id}
    assert waiting.id not in chain.published_candidate_ids("s")
    assert chain.published_candidate_ids("other") == set()
    assert chain.get_candidate(elsewhere.id).state == "passed"


def test_explicit_evidence_is_stored_on_the_release(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = passed_candidate(chain, root, manifest(adapter=1))
    release = chain.publish(candidate.id, root.id, "w", "r", evidence={"p_value": 0.01})
    assert chain.get_release(release.id).evidence == {"p_value": 0.01}


def test_publish_from_a_moved_head_conflicts_and_writes_nothing(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    first = passed_candidate(chain, root, manifest(adapter=1))
    second = passed_candidate(chain, root, manifest(adapter=2))
    winner = chain.publish(first.id, root.id, "w1", "first")
    with pytest.raises(ReleaseConflictError) as caught:
        chain.publish(second.id, root.id, "w2", "second")
    assert isinstance(caught.value, ConflictError)
    assert (caught.value.expected, caught.value.current) == (root.id, winner.id)
    assert winner.id in caught.value.message
    assert [r.id for r in chain.releases("s")] == [winner.id, root.id]
    assert chain.get_candidate(second.id).state == "passed"


def test_the_head_update_is_the_guard_even_past_the_pre_check(
    chain: ReleaseChain, manifest: ManifestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On PostgreSQL the head can move between the pre-check read and the UPDATE; make
    # the pre-check blind to show that the conditional UPDATE alone refuses a stale head.
    root = chain.create("s", manifest(), "config", "init")
    moved = chain.publish(passed_candidate(chain, root, manifest(adapter=1)).id, root.id, "w", "")
    stale = passed_candidate(chain, root, manifest(adapter=2))
    monkeypatch.setattr(chain_module, "check_expected_head", lambda conn, s, expected: 5)
    with pytest.raises(ReleaseConflictError) as caught:
        chain.publish(stale.id, root.id, "w", "stale")
    assert caught.value.current == moved.id
    with pytest.raises(ReleaseConflictError):
        chain.rollback("s", root.id, "not-the-head", "a", "stale")
    assert [r.id for r in chain.releases("s")] == [moved.id, root.id]
    assert chain.get_candidate(stale.id).state == "passed"


def test_a_candidate_built_on_an_older_release_publishes_onto_the_named_head(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    older = passed_candidate(chain, root, manifest(adapter=1))
    newer = chain.publish(passed_candidate(chain, root, manifest(adapter=2)).id, root.id, "w", "r")
    release = chain.publish(older.id, newer.id, "w", "judged against the current head")
    assert (release.seq, release.parent_id) == (3, newer.id)


def test_publish_with_a_foreign_or_unknown_expected_head_conflicts(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    other = chain.create("t", manifest(), "config", "init")
    candidate = passed_candidate(chain, root, manifest(adapter=1))
    for wrong in (other.id, "no-such-release"):
        with pytest.raises(ReleaseConflictError) as caught:
            chain.publish(candidate.id, wrong, "w", "r")
        assert caught.value.current == root.id


def test_publish_before_create_is_not_found(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    candidate = chain.propose("s", manifest(adapter=1), None, "w", "first ever")
    with pytest.raises(ScenarioHasNoReleaseError):
        chain.publish(candidate.id, "anything", "w", "r", require_passed=False)


def test_only_passed_candidates_publish_unless_manual(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    pending = chain.propose("s", manifest(adapter=1), root.id, "admin", "hand-made")
    with pytest.raises(InvalidTransitionError):
        chain.publish(pending.id, root.id, "admin", "r")
    release = chain.publish(pending.id, root.id, "admin", "manual", require_passed=False)
    assert chain.get_candidate(pending.id).state == "published"
    rejected = chain.propose("s", manifest(adapter=2), release.id, "w", "r")
    chain.set_candidate_state(rejected.id, "evaluating")
    chain.set_candidate_state(rejected.id, "rejected", evidence={"win": 0.1})
    for require_passed in (True, False):
        with pytest.raises(InvalidTransitionError):
            chain.publish(rejected.id, release.id, "w", "r", require_passed=require_passed)
    with pytest.raises(InvalidTransitionError):  # published is final
        chain.publish(pending.id, release.id, "admin", "again", require_passed=False)
    assert chain.head("s") == release


def test_promote_publishes_a_passed_candidate_as_promote(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    candidate = passed_candidate(chain, root, manifest(harness=3))
    assert [c.id for c in chain.candidates("s", state="passed")] == [candidate.id]
    release = chain.promote(candidate.id, root.id, "cli:alice", "reviewed the diff")
    assert (release.operation, release.created_by, release.reason) == (
        "promote",
        "cli:alice",
        "reviewed the diff",
    )
    assert chain.candidates("s", state="passed") == []


def test_rollback_appends_a_copy_of_an_earlier_release(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(harness=1), "config", "init")
    learned = chain.publish(passed_candidate(chain, root, manifest(adapter=2)).id, root.id, "w", "")
    back = chain.rollback("s", root.id, learned.id, "cli:bob", "regression", {"ticket": 12})
    assert (back.seq, back.parent_id, back.operation) == (3, learned.id, "rollback")
    assert (back.rolled_back_to, back.evidence, back.reason) == (
        root.id,
        {"ticket": 12},
        "regression",
    )
    assert back.manifest == root.manifest
    assert chain.head("s") == back
    # Rolling forward again is a rollback to the learned release.
    forward = chain.rollback("s", learned.id, back.id, "cli:bob", "fixed")
    assert forward.manifest == learned.manifest and forward.seq == 4


def test_rollback_refuses_bad_targets_and_stale_heads(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    other = chain.create("t", manifest(), "config", "init")
    learned = chain.publish(passed_candidate(chain, root, manifest(adapter=1)).id, root.id, "w", "")
    with pytest.raises(ReleaseNotFoundError):
        chain.rollback("s", other.id, learned.id, "a", "other scenario")
    with pytest.raises(ReleaseNotFoundError):
        chain.rollback("s", "nope", learned.id, "a", "unknown")
    with pytest.raises(InvalidInputError):
        chain.rollback("s", learned.id, learned.id, "a", "to the head itself")
    with pytest.raises(ReleaseConflictError):
        chain.rollback("s", root.id, root.id, "a", "stale head")
    assert [r.id for r in chain.releases("s")] == [learned.id, root.id]


def test_candidate_lifecycle_allows_only_legal_moves(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(), "config", "init")
    c = chain.propose("s", manifest(adapter=1), root.id, "w", "r")
    assert (c.state, c.created_by, c.reason, c.parent_release_id) == ("pending", "w", "r", root.id)
    for illegal in ("passed", "rejected", "published", "pending"):
        with pytest.raises(InvalidTransitionError):
            chain.set_candidate_state(c.id, illegal)
    assert chain.set_candidate_state(c.id, "evaluating").state == "evaluating"
    # an undecided gate records its evidence and keeps the candidate evaluating
    waiting = chain.set_candidate_state(c.id, "evaluating", {"gate": {"verdict": "undecided"}})
    assert (waiting.state, waiting.evidence) == ("evaluating", {"gate": {"verdict": "undecided"}})
    with pytest.raises(InvalidTransitionError):
        chain.set_candidate_state(c.id, "pending")
    assert chain.set_candidate_state(c.id, "abandoned").state == "abandoned"
    for state in ("pending", "evaluating", "passed", "abandoned"):
        with pytest.raises(InvalidTransitionError):
            chain.set_candidate_state(c.id, state)
    with pytest.raises(InvalidInputError):
        chain.set_candidate_state(c.id, "shipped")  # type: ignore[arg-type]
    with pytest.raises(CandidateNotFoundError):
        chain.set_candidate_state("nope", "evaluating")
    stored = chain.get_candidate(c.id)
    assert stored.state == "abandoned" and stored.updated_at >= stored.created_at


def test_propose_checks_the_parent(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    chain.create("s", manifest(), "config", "init")
    other = chain.create("t", manifest(), "config", "init")
    with pytest.raises(NotFoundError):
        chain.propose("s", manifest(), other.id, "w", "wrong scenario")


def test_releases_are_append_only(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    def rows() -> dict[str, dict[str, Any]]:
        with chain.database.engine.connect() as conn:
            return {r["id"]: dict(r) for r in conn.execute(select(releases_table)).mappings()}

    root = chain.create("s", manifest(), "config", "init")
    learned = chain.publish(passed_candidate(chain, root, manifest(adapter=1)).id, root.id, "w", "")
    before = rows()
    assert set(before) == {root.id, learned.id}
    back = chain.rollback("s", root.id, learned.id, "a", "r")
    late = passed_candidate(chain, root, manifest(adapter=2))
    with pytest.raises(ReleaseConflictError):
        chain.publish(late.id, learned.id, "w", "stale")
    chain.promote(late.id, back.id, "a", "r")
    chain.create("s", manifest(adapter=5), "config", "again")
    after = rows()
    assert len(after) == 4
    assert {k: after[k] for k in before} == before


def test_listings_scenarios_and_paging(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    head = chain.create("s", manifest(), "config", "init")
    for n in range(4):
        head = chain.publish(
            passed_candidate(chain, head, manifest(adapter=n)).id, head.id, "w", ""
        )
    chain.create("t", manifest(), "config", "init")
    assert [r.seq for r in chain.releases("s", limit=2)] == [5, 4]
    assert [r.seq for r in chain.releases("s", limit=2, before_seq=4)] == [3, 2]
    with pytest.raises(InvalidInputError):
        chain.releases("s", limit=0)
    summaries = {s.name: s for s in chain.scenarios()}
    assert (summaries["s"].head_release_id, summaries["s"].head_seq) == (head.id, 5)
    assert (summaries["s"].releases, summaries["t"].releases) == (5, 1)
    assert set(chain.heads_snapshot()) == {"s", "t"}
    assert chain.candidates("s", state="published")[0].id == head.candidate_id


def test_reachable_artifacts_cover_releases_and_live_candidates(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    root = chain.create("s", manifest(adapter=1, harness=2), "config", "init")
    chain.propose("s", manifest(adapter=3), root.id, "w", "pending")
    passed_candidate(chain, root, manifest(harness=4))
    dropped = chain.propose("s", manifest(adapter=5, harness=6), root.id, "w", "r")
    chain.set_candidate_state(dropped.id, "abandoned")
    assert chain.reachable_artifacts() == {digest(n) for n in (1, 2, 3, 4)}
    full = ReleaseManifest(model=ModelComponent(base="tiny-llama", checkpoint=digest(7)))
    chain.propose("s", full, root.id, "w", "a checkpoint")  # a full fine-tune's candidate
    assert chain.reachable_artifacts() == {digest(n) for n in (1, 2, 3, 4, 7)}


def test_manifests_validate_digests() -> None:
    with pytest.raises(ValueError, match="sha256"):
        ModelComponent(base="m", adapter="sha256:abc")
    with pytest.raises(ValueError, match="harness"):
        ReleaseManifest(model=ModelComponent(base="m"), harness="md5:00")
    with pytest.raises(InvalidInputError):
        ReleaseManifest.from_json({"model": {"base": "m"}, "unknown": 1})
    parsed = ReleaseManifest.from_json(
        {"model": {"base": "m", "adapter": None}, "parent": "x", "operation": "learn"}
    )
    assert parsed == ReleaseManifest(model=ModelComponent(base="m"))


def test_evidence_must_be_json(chain: ReleaseChain, manifest: ManifestFactory) -> None:
    root = chain.create("s", manifest(), "config", "init")
    with pytest.raises(InvalidInputError):
        chain.propose("s", manifest(), root.id, "w", "r", evidence={"x": object()})


def test_candidate_rows_from_revision_0001_still_read(tmp_path: Any) -> None:
    from datetime import UTC, datetime

    from reef.db import Database
    from reef.db.engine import create_store_engine
    from reef.db.migrations import upgrade

    engine = create_store_engine(f"sqlite:///{tmp_path / 'old.db'}")
    upgrade(engine, "0001")
    created = datetime(2025, 1, 1, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(
            candidates_table.insert().values(
                id="old",
                scenario="s",
                parent_release_id=None,
                manifest_json='{"schema_version": 1, "model": {"base": "m"}}',
                state="pending",
                created_at=created,
            )
        )
    upgrade(engine)
    chain = ReleaseChain(Database(engine))
    old = chain.get_candidate("old")
    assert (old.updated_at, old.created_by, old.reason) == (created, None, None)
    engine.dispose()


def test_forget_scenario_asks_the_other_stores_in_its_transaction(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    """Each store counts its own tables, on the chain's deleting transaction."""
    from sqlalchemy.engine import Connection

    from reef.evaluation import evaluation_holdings
    from reef.experience import experience_holdings
    from reef.jobs import JobQueue, job_holdings
    from reef.releases import ScenarioInUseError

    others = (experience_holdings, job_holdings, evaluation_holdings)
    chain.create("stray", manifest(), "gateway", "scenario first served")
    JobQueue(chain.database).enqueue("stray", "learn", {"trigger": "manual"})
    with pytest.raises(ScenarioInUseError, match="'stray' holds 1 learning job: "):
        chain.forget_scenario("stray", others)

    asked: list[bool] = []

    def records(conn: Connection, scenario: str) -> dict[str, int]:
        asked.append(conn.in_transaction())
        return {"record": 2, "stored response": 0}

    chain.create("quiet", manifest(), "gateway", "scenario first served")
    with pytest.raises(ScenarioInUseError, match="'quiet' holds 2 records: "):
        chain.forget_scenario("quiet", (records, *others))
    assert asked == [True]
    chain.forget_scenario("quiet", others)  # nothing held anywhere
    assert chain.head("quiet") is None


def test_forget_scenario_deletes_only_a_scenario_that_holds_nothing(
    chain: ReleaseChain, manifest: ManifestFactory
) -> None:
    from reef.releases import ScenarioInUseError, ScenarioNotFoundError

    chain.create("stray", manifest(), "gateway", "scenario first served")
    chain.forget_scenario("stray", ())
    assert chain.head("stray") is None and chain.releases("stray") == []
    assert "stray" not in [s.name for s in chain.scenarios()]
    with pytest.raises(ScenarioNotFoundError):
        chain.forget_scenario("stray", ())

    root = chain.create("s", manifest(), "gateway", "scenario first served")
    candidate = passed_candidate(chain, root, manifest(adapter=1))
    with pytest.raises(ScenarioInUseError, match="1 candidate"):
        chain.forget_scenario("s", ())
    chain.publish(candidate.id, root.id, "worker:1", "gate passed")
    with pytest.raises(ScenarioInUseError, match="2 releases") as refused:
        chain.forget_scenario("s", ())
    assert isinstance(refused.value, ConflictError)
    assert [r.seq for r in chain.releases("s")] == [2, 1]  # nothing was deleted
