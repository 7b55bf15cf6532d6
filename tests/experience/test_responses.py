"""Stored responses (the state behind ``previous_response_id``) on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses

import pytest

from reef.core.errors import InvalidInputError, NotFoundError
from reef.experience import (
    ResponseNotFoundError,
    ResponseStore,
    SQLExperienceStore,
    StoredResponse,
)
from tests.experience.conftest import DraftFactory


def _stored(response_id: str = "resp_1", scenario: str = "support") -> StoredResponse:
    return StoredResponse(
        id=response_id,
        scenario=scenario,
        session_id="session-1",
        record_id="record-1",
        previous_response_id=None,
        principal="key-a",
        input_items=[{"id": "msg_1", "type": "message", "role": "user", "content": "hi"}],
        response={
            "id": response_id,
            "object": "response",
            "output": [{"id": "msg_2", "type": "message", "role": "assistant", "content": []}],
        },
    )


def test_a_stored_response_reads_back_whole(store: SQLExperienceStore) -> None:
    responses = ResponseStore(store.database)
    responses.put(_stored())
    back = responses.get("resp_1")
    assert back.scenario == "support" and back.session_id == "session-1"
    assert back.record_id == "record-1" and back.principal == "key-a"
    assert back.input_items == _stored().input_items
    assert back.response == _stored().response
    assert back.created_at is not None and back.created_at.tzinfo is not None
    assert [item["id"] for item in back.conversation()] == ["msg_1", "msg_2"]
    # a second store on the same database (another gateway, a restart) reads it too
    again = SQLExperienceStore.from_url(str(store.database.url))
    try:
        assert ResponseStore(again.database).get("resp_1", "support").id == "resp_1"
    finally:
        again.close()


def test_unknown_and_other_scenarios_ids_are_not_found(store: SQLExperienceStore) -> None:
    responses = ResponseStore(store.database)
    responses.put(_stored())
    with pytest.raises(ResponseNotFoundError, match="'resp_none' not found"):
        responses.get("resp_none")
    with pytest.raises(ResponseNotFoundError, match="in scenario 'billing'"):
        responses.get("resp_1", "billing")
    with pytest.raises(ResponseNotFoundError):
        responses.delete("resp_1", "billing")
    assert responses.get("resp_1", "support").id == "resp_1"


def test_delete_forgets_a_response(store: SQLExperienceStore) -> None:
    responses = ResponseStore(store.database)
    responses.put(_stored("resp_1"))
    responses.put(_stored("resp_2"))
    responses.delete("resp_1")
    with pytest.raises(ResponseNotFoundError):
        responses.get("resp_1")
    with pytest.raises(ResponseNotFoundError):
        responses.delete("resp_1")
    assert responses.get("resp_2").id == "resp_2"


def test_a_kept_response_is_written_with_its_record(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    """A recorded Responses exchange keeps its response in the record's transaction, on
    both write paths (the waiting batch and, on SQLite, the loop's write-now path)."""
    responses = ResponseStore(store.database)
    first = make_draft(kept_response=_stored("resp_a"))
    assert store.write_records([first]) == [first.id]
    assert responses.get("resp_a").record_id == "record-1"
    now = make_draft(kept_response=_stored("resp_b"))
    written = store.write_records_now([now])
    if written is not None:  # SQLite; PostgreSQL never writes without waiting
        assert written == [now.id]
        assert responses.get("resp_b").response["id"] == "resp_b"


def test_a_draft_that_deduplicates_keeps_no_second_response(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    responses = ResponseStore(store.database)
    one = make_draft(idempotency_key="k", kept_response=_stored("resp_1"))
    two = make_draft(idempotency_key="k", kept_response=_stored("resp_2"))
    assert store.write_records([one, two]) == [one.id, one.id]
    assert responses.get("resp_1").id == "resp_1"
    with pytest.raises(ResponseNotFoundError):
        responses.get("resp_2")
    three = make_draft(idempotency_key="k", kept_response=_stored("resp_3"))
    assert store.write_records([three]) == [one.id]
    with pytest.raises(ResponseNotFoundError):
        responses.get("resp_3")


def test_a_record_batch_that_fails_keeps_none_of_its_responses(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    """One transaction: a response whose record was not written is not kept either, and
    a record whose response could not be kept is not written either."""
    responses = ResponseStore(store.database)
    fine = make_draft(kept_response=_stored("resp_new"))
    broken = dataclasses.replace(_stored("resp_broken"), response={"output": object()})
    bad = make_draft(kept_response=broken)
    with pytest.raises(InvalidInputError, match="response is not JSON-serialisable"):
        store.write_records([fine, bad])
    for response_id in ("resp_new", "resp_broken"):
        with pytest.raises(ResponseNotFoundError):
            responses.get(response_id)
    for draft in (fine, bad):
        with pytest.raises(NotFoundError):
            store.get_record(draft.id)


def test_a_response_kept_twice_is_kept_once(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    """A batch written again (a retry after a commit whose answer was lost) keeps its
    responses once, as it writes its records once."""
    responses = ResponseStore(store.database)
    draft = make_draft(kept_response=_stored("resp_once"))
    assert store.write_records([draft]) == [draft.id]
    assert store.write_records([draft]) == [draft.id]
    assert responses.get("resp_once").record_id == "record-1"
