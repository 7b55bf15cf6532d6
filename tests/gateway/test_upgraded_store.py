"""The store of an earlier Reef opens in this gateway: a SQLite store at revision 0005
holding chats and feedback with corrections and refs (the revision whose upgrade once
failed on feedback_refs) is upgraded on start, and every record and feedback row reads
back through the HTTP API; new traffic is recorded beside them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef.core import loads
from reef.db.engine import create_store_engine
from tests.db.revision_fixtures import ROWS, build_store, insert_rows, traffic
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import call


def _pages(gateway: GatewayThread, path: str, cursor_field: str, cursor_param: str) -> list[Any]:
    found: list[Any] = []
    cursor: str | None = None
    while True:
        query = f"?limit=100&{cursor_param}={cursor}" if cursor else "?limit=100"
        answer = call(gateway.port, "GET", path + query)
        assert answer.status == 200, answer.body
        page = answer.json()
        found += page["data"]
        cursor = page[cursor_field]
        if cursor is None:
            return found


def test_a_revision_0005_store_with_feedback_opens_and_reads_back_over_http(
    tmp_path: Path, fake: FakeUpstreamThread
) -> None:
    settings = make_settings(tmp_path, fake.base_url)
    engine = create_store_engine(settings.store_url())
    build_store(engine, "0005")
    more = traffic(chats=95, feedback=30)
    insert_rows(engine, "0005", more)
    engine.dispose()
    written = {table: ROWS[table] + more.get(table, []) for table in ("records", "feedback")}
    refs: dict[str, list[str]] = {}
    for ref in sorted(
        ROWS["feedback_refs"] + more["feedback_refs"], key=lambda ref: ref["position"]
    ):
        refs.setdefault(ref["feedback_id"], []).append(ref["record_id"])

    with GatewayThread(settings) as gateway:  # migrated on open, as `reef serve` does
        records = _pages(gateway, "/reef/scenarios/support/records", "next_cursor", "cursor")
        assert len(written["records"]) == 193
        by_id = {record["id"]: record for record in records}
        assert sorted(by_id) == sorted(row["id"] for row in written["records"])
        for row in written["records"]:
            record = by_id[row["id"]]
            assert record["request"] == loads(row["request_json"])
            assert record["response"] == loads(row["response_json"])
            assert (record["session_id"], record["turn"]) == (row["session_id"], row["turn"])
        one = call(gateway.port, "GET", "/reef/records/rec-2").json()
        assert [f["id"] for f in one["feedback"]] == ["fb-1"]

        feedback = _pages(gateway, "/reef/scenarios/support/feedback", "next_before", "before")
        assert len(written["feedback"]) == 32
        by_id = {note["id"]: note for note in feedback}
        assert sorted(by_id) == sorted(row["id"] for row in written["feedback"])
        for row in written["feedback"]:
            note = by_id[row["id"]]
            assert note["record_ids"] == refs[row["id"]]
            assert note["correction"] == (
                None if row["correction_json"] is None else loads(row["correction_json"])
            )
            assert note["trust"] == ("operator" if row["principal"] is None else "user")
            assert note["source"] == "explicit"

        raw = gateway.openai().chat.completions.with_raw_response.create(
            model="reef/support", messages=[{"role": "user", "content": "after the upgrade"}]
        )
        new_id = raw.headers["x-reef-record-id"]
        assert call(gateway.port, "GET", f"/reef/records/{new_id}").status == 200
    assert (tmp_path / "reef.db.before-0005").exists()
