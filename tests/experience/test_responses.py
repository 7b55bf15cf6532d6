"""Stored responses (the state behind ``previous_response_id``) on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from reef.experience import (
    ResponseNotFoundError,
    ResponseStore,
    SQLExperienceStore,
    StoredResponse,
)


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
