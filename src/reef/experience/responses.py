"""Stored responses of the OpenAI Responses API: the conversation state behind
``previous_response_id``.

A stored response is self-contained: the whole input it answered (the turns before it
included, as Responses items) and the response object. Continuing it needs one read,
and deleting a response earlier in a chain leaves the later ones whole. Rows live in
the experience database (``responses`` table), so they survive restarts and every
gateway on the store sees them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import RowMapping

from reef.core.errors import NotFoundError
from reef.db import Database
from reef.db import schema as t
from reef.experience.records import StoredResponse
from reef.experience.sql.rows import from_json_text, response_row


class ResponseNotFoundError(NotFoundError):
    """No stored response with this id (in this scenario, where one was named)."""

    def __init__(self, response_id: str, scenario: str | None = None) -> None:
        where = f" in scenario {scenario!r}" if scenario is not None else ""
        super().__init__(f"response {response_id!r} not found{where}")
        self.response_id = response_id
        self.scenario = scenario


class ResponseStore:
    """Stored responses on the ``Database`` the composition root hands it (migrated)."""

    def __init__(self, database: Database) -> None:
        self.database = database

    def put(self, stored: StoredResponse) -> None:
        """Keep ``stored``; raises ``StoreUnavailableError`` when the store is down. (The
        gateway keeps a response only with its record, ``RecordDraft.kept_response``, one
        transaction for both: an exchange that is not captured keeps nothing.)"""
        with self.database.write() as conn:
            conn.execute(insert(t.responses).values(**response_row(stored, datetime.now(UTC))))

    def get(self, response_id: str, scenario: str | None = None) -> StoredResponse:
        """The stored response ``response_id``; ``ResponseNotFoundError`` when there is
        none, or when ``scenario`` is given and it belongs to another (so one scenario
        cannot tell another's ids from unknown ones)."""
        with self.database.read() as conn:
            row = (
                conn.execute(select(t.responses).where(t.responses.c.id == response_id))
                .mappings()
                .first()
            )
        if row is None or (scenario is not None and row["scenario"] != scenario):
            raise ResponseNotFoundError(response_id, scenario)
        return _stored(row)

    def delete(self, response_id: str, scenario: str | None = None) -> None:
        """Forget the stored response ``response_id`` (the record of its exchange stays);
        ``ResponseNotFoundError`` as ``get``."""
        clause = t.responses.c.id == response_id
        if scenario is not None:
            clause = clause & (t.responses.c.scenario == scenario)
        with self.database.write() as conn:
            deleted = conn.execute(delete(t.responses).where(clause)).rowcount
        if not deleted:
            raise ResponseNotFoundError(response_id, scenario)


def _stored(row: RowMapping) -> StoredResponse:
    return StoredResponse(
        id=row["id"],
        scenario=row["scenario"],
        session_id=row["session_id"],
        record_id=row["record_id"],
        previous_response_id=row["previous_response_id"],
        principal=row["principal"],
        input_items=from_json_text(row["input_json"]),
        response=from_json_text(row["response_json"]),
        created_at=row["created_at"],
    )
