"""Writing and reading records: every field, turns, idempotency, sessions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from reef.core import new_id
from reef.experience import (
    RecordNotFoundError,
    SessionNotFoundError,
    SQLExperienceStore,
)
from tests.experience.conftest import DraftFactory


def test_every_field_round_trips(store: SQLExperienceStore, make_draft: DraftFactory) -> None:
    created = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
    draft = make_draft(
        scenario="triage",
        session_id="sesión-ü",
        api="anthropic.messages",
        request={"messages": [{"role": "user", "content": "ünïcode ✓"}], "n": 1.5, "z": None},
        response={"content": [{"type": "text", "text": "ok"}], "nested": {"list": [1, 2]}},
        status="error",
        error="upstream said no",
        latency_ms=987.25,
        usage={"input_tokens": 10},
        release_id=new_id(),
        prompt_hash="sha256:" + "1" * 64,
        content_hash="sha256:" + "2" * 64,
        continuation_hash="sha256:" + "3" * 64,
        tags={"team": "blue", "exp": "42"},
        principal="key-ops",
        purpose="canary",
        idempotency_key="idem-1",
        created_at=created,
    )
    assert store.write_records([draft]) == [draft.id]

    view = store.get_record(draft.id)

    assert view.id == draft.id
    assert view.scenario == "triage"
    assert view.session_id == "sesión-ü"
    assert view.turn == 0
    assert view.release_id == draft.release_id
    assert view.api == "anthropic.messages"
    assert view.request == draft.request
    assert view.response == draft.response
    assert view.status == "error"
    assert view.error == "upstream said no"
    assert view.latency_ms == 987.25
    assert view.usage == {"input_tokens": 10}
    assert view.prompt_hash == draft.prompt_hash
    assert view.content_hash == draft.content_hash
    assert view.continuation_hash == draft.continuation_hash
    assert view.tags == {"team": "blue", "exp": "42"}
    assert view.principal == "key-ops"
    assert view.purpose == "canary"
    assert view.idempotency_key == "idem-1"
    assert view.created_at == created
    assert view.created_at.tzinfo == UTC
    assert view.feedback == ()


def test_nullable_fields_round_trip_as_none(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    draft = make_draft(response=None, usage=None, continuation_hash=None)
    store.write_records([draft])
    view = store.get_record(draft.id)
    assert (view.response, view.usage, view.error, view.release_id) == (None, None, None, None)
    assert view.purpose == "serve"
    assert view.created_at.tzinfo == UTC
    assert abs(view.created_at - datetime.now(UTC)) < timedelta(minutes=1)


def test_turns_continue_each_session_across_batches(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    first = [make_draft(session_id="a"), make_draft(session_id="b"), make_draft(session_id="a")]
    second = [make_draft(session_id="a"), make_draft(session_id="c"), make_draft(session_id="b")]
    store.write_records(first)
    store.write_records(second)

    turns = {d.id: store.get_record(d.id).turn for d in first + second}
    assert [turns[d.id] for d in first] == [0, 0, 1]
    assert [turns[d.id] for d in second] == [2, 0, 1]
    assert [r.turn for r in store.get_session("support", "a")] == [0, 1, 2]


def test_the_same_session_id_in_two_scenarios_is_two_sessions(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    store.write_records([make_draft(scenario="x", session_id="s")])
    other = make_draft(scenario="y", session_id="s")
    store.write_records([other])
    assert store.get_record(other.id).turn == 0


def test_idempotency_key_dedupes_within_and_across_batches(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    a1 = make_draft(idempotency_key="k1")
    a2 = make_draft(idempotency_key="k1")
    b = make_draft(idempotency_key="k2")
    plain = make_draft()
    assert store.write_records([a1, b, a2, plain]) == [a1.id, b.id, a1.id, plain.id]

    retry_a = make_draft(idempotency_key="k1")
    retry_b = make_draft(idempotency_key="k2")
    fresh = make_draft(idempotency_key="k3")
    assert store.write_records([retry_a, fresh, retry_b]) == [a1.id, fresh.id, b.id]

    with pytest.raises(RecordNotFoundError):
        store.get_record(a2.id)
    with pytest.raises(RecordNotFoundError):
        store.get_record(retry_a.id)
    # Skipped drafts take no turn: the session has no gaps.
    assert [r.turn for r in store.get_session("support", "session-1")] == [0, 1, 2, 3]
    assert store.find_by_idempotency_key("support", "k1") == a1.id
    assert store.find_by_idempotency_key("support", "k3") == fresh.id
    assert store.find_by_idempotency_key("support", "missing") is None


def test_idempotency_keys_are_per_scenario(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    x = make_draft(scenario="x", idempotency_key="k")
    y = make_draft(scenario="y", idempotency_key="k")
    assert store.write_records([x, y]) == [x.id, y.id]
    assert store.find_by_idempotency_key("y", "k") == y.id


def test_rewriting_a_committed_batch_is_harmless(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    drafts = [make_draft(), make_draft()]
    store.write_records(drafts)
    # A retry after a lost commit acknowledgement sends the very same drafts again.
    assert store.write_records(drafts) == [d.id for d in drafts]
    assert len(store.get_session("support", "session-1")) == 2


def test_empty_batch_writes_nothing(store: SQLExperienceStore) -> None:
    assert store.write_records([]) == []


def test_find_session_prefers_the_longest_prefix_then_the_newest(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    base = datetime(2024, 1, 1, tzinfo=UTC)
    older_short = make_draft(session_id="s1", continuation_hash="h-short", created_at=base)
    newer_short = make_draft(
        session_id="s2", continuation_hash="h-short", created_at=base + timedelta(seconds=1)
    )
    long = make_draft(session_id="s3", continuation_hash="h-long", created_at=base)
    elsewhere = make_draft(scenario="other", session_id="s4", continuation_hash="h-longest")
    store.write_records([older_short, newer_short, long, elsewhere])

    match = store.find_session("support", ["h-longest", "h-long", "h-short"])
    assert match is not None
    assert (match.session_id, match.record_id, match.turn) == ("s3", long.id, 0)

    match = store.find_session("support", ["h-unknown", "h-short"])
    assert match is not None
    assert (match.session_id, match.record_id) == ("s2", newer_short.id)

    assert store.find_session("support", ["h-unknown"]) is None
    assert store.find_session("support", []) is None
    assert store.find_session("nobody", ["h-long"]) is None


def test_find_session_breaks_timestamp_ties_by_newest_id(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    drafts = [make_draft(session_id=f"s{i}", continuation_hash="same") for i in range(3)]
    store.write_records(drafts)  # one batch: one created_at
    match = store.find_session("support", ["same"])
    assert match is not None
    assert match.record_id == max(d.id for d in drafts)


def test_get_session_returns_turn_order_and_raises_when_missing(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    drafts = [make_draft(session_id="s") for _ in range(3)]
    store.write_records(drafts)
    assert [r.id for r in store.get_session("support", "s")] == [d.id for d in drafts]
    with pytest.raises(SessionNotFoundError, match="'nope'"):
        store.get_session("support", "nope")
    with pytest.raises(SessionNotFoundError):
        store.get_session("other-scenario", "s")


def test_get_record_names_the_missing_id(store: SQLExperienceStore) -> None:
    with pytest.raises(RecordNotFoundError, match="rec-404"):
        store.get_record("rec-404")


def test_ping_succeeds_on_a_writable_store(store: SQLExperienceStore) -> None:
    store.ping()
