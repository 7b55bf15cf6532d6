"""A store that cannot be written (SQLite's own SQLITE_FULL, from a page limit on every
connection of the store, as a full disk gives it) is answered 503 with the reason and a
``Retry-After`` in each dialect, logged once per episode, reported by ``/readyz``, and
recovered from without a restart once space is back; no acknowledged record is lost."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from sqlalchemy import event

from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call

FULL = "experience store unavailable: database or disk is full"
UNLIMITED = 1 << 30


class PageLimit:
    """``PRAGMA max_page_count`` on every connection of the store, applied whenever one
    is opened or checked out of the pool: SQLite then fails any write that needs a
    page beyond it with SQLITE_FULL, as it does on a full disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pages = UNLIMITED

    def apply(self, dbapi_connection: Any, *_: Any) -> None:
        dbapi_connection.execute(f"PRAGMA max_page_count = {self.pages}")

    def fill(self) -> None:
        """Leave room for a few pages more than the store holds now."""
        conn = sqlite3.connect(self.path)
        try:
            self.pages = int(conn.execute("PRAGMA page_count").fetchone()[0]) + 12
        finally:
            conn.close()


def _ask(gateway: GatewayThread, text: str) -> str | None:
    """Ask once; the receipt's record id, or None when the store refused (a 503)."""
    try:
        raw = gateway.openai().chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": text * 40}]
        )
    except openai.APIStatusError as error:
        assert error.status_code == 503, error
        assert error.response.json()["error"]["message"] == FULL
        assert error.response.headers["retry-after"] == "10"
        assert error.response.json()["error"]["type"] == "service_unavailable"
        assert "x-reef-record-id" not in error.response.headers
        return None
    return raw.headers["x-reef-record-id"]


def test_a_full_store_answers_503_until_space_returns(
    tmp_path: Path, fake: FakeUpstreamThread, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = GatewayThread(make_settings(tmp_path, fake.base_url))
    limit = PageLimit(tmp_path / "reef.db")
    event.listen(gateway.database.engine, "connect", limit.apply)
    event.listen(gateway.database.engine, "checkout", limit.apply)
    with gateway, caplog.at_level(logging.INFO, logger="reef"):
        assert call(gateway.port, "GET", "/readyz").status == 200
        limit.fill()  # before the first record: the writer's connections open with it
        acknowledged: list[str] = []
        refused = 0
        for number in range(300):  # traffic until the store is full, then a few more
            record_id = _ask(gateway, f"question {number} ")
            if record_id is None:
                refused += 1
                if refused == 5:
                    break
            else:
                assert refused == 0  # once full, it stays full
                acknowledged.append(record_id)
        assert refused == 5, "the page limit never filled the store"

        with pytest.raises(anthropic.APIStatusError) as caught:
            gateway.anthropic().messages.create(
                model="reef/claude", max_tokens=16, messages=[{"role": "user", "content": "x"}]
            )
        assert caught.value.status_code == 503
        assert caught.value.body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": FULL},
        }
        assert caught.value.response.headers["retry-after"] == "10"

        # Reef's own routes answer in the OpenAI shape (20 kB of metadata needs new pages).
        note = {"record_ids": [acknowledged[0]], "score": 1, "metadata": {"n": "x" * 20_000}}
        refused_note = call(gateway.port, "POST", "/reef/feedback", note)
        assert refused_note.status == 503, refused_note.body
        assert refused_note.json()["error"]["message"] == FULL
        assert refused_note.headers["retry-after"] == "10"

        ready = call(gateway.port, "GET", "/readyz")
        assert ready.status == 503, ready.body
        assert ready.json()["checks"]["store"] == f"not writable: {FULL}"

        limit.pages = UNLIMITED  # space is back: no restart
        ready = call(gateway.port, "GET", "/readyz")
        assert ready.status == 200, ready.body
        after = _ask(gateway, "after the disk was freed")
        assert after is not None
        acknowledged.append(after)

    conn = sqlite3.connect(tmp_path / "reef.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    lost = [record_id for record_id in acknowledged if _missing(gateway, record_id)]
    assert len(acknowledged) > 2 and lost == []
    messages = [r.getMessage() for r in caplog.records]
    assert sum("the store cannot be written" in m for m in messages) == 1, messages
    assert sum("the store is writable again" in m for m in messages) == 1, messages
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def _missing(gateway: GatewayThread, record_id: str) -> bool:
    from reef.experience import RecordNotFoundError, SQLExperienceStore

    store = SQLExperienceStore.from_url(gateway.settings.store_url())
    try:
        store.get_record(record_id)
    except RecordNotFoundError:
        return True
    finally:
        store.close()
    return False
