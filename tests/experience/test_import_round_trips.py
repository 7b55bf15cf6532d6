"""A round trip per import format that Reef does not write itself (``openai-chat``,
``langfuse``, ``langsmith``, ``tensorzero``; ``reef``, ``openai-finetune`` and ``otel``
round-trip through their own writers in test_importing.py and test_export_otel.py).

Each fixture (written from the tool's export documentation: tool calls, multi-turn
conversations, and feedback where the format has any; OpenAI's chat completions carry
none) is imported, written out with ``reef export``, imported into
another store and written out again: both exports match apart from what a store mints
(feedback ids and times) and the origin tags, so nothing read from the source (the
conversations, answers, sessions and their order, times, token counts, source ids,
feedback with its scores and corrections) is lost on the way out. ``openai-chat`` also
comes back line for line: each record's request and response are the source line's."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reef.experience import (
    ORIGIN_TAG,
    SOURCE_TAG,
    SQLExperienceStore,
    export_records,
)
from tests.experience.importing_helpers import run_import

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
# format -> (records, feedback rows on records, session outcomes, lines skipped: a
# LangSmith chain run holds no model call) its fixture holds
FIXTURES = {
    "openai-chat": (4, 0, 0, 0),
    "langfuse": (4, 3, 0, 0),
    "langsmith": (3, 3, 0, 1),
    "tensorzero": (3, 3, 1, 0),
}


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[SQLExperienceStore, SQLExperienceStore]]:
    first = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'a.db'}", migrate=True)
    second = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'b.db'}", migrate=True)
    yield first, second
    first.close()
    second.close()


def exported(store: SQLExperienceStore) -> list[dict[str, Any]]:
    out = io.BytesIO()
    export_records(store, "s", "reef", out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """An exported record less what the store mints and the import's origin tags (the
    second import's source is the Reef export, whose id is the record's; the first
    source's id stays in the idempotency key, compared)."""
    feedback = [
        {k: v for k, v in f.items() if k not in ("id", "created_at")} for f in row["feedback"]
    ]
    tags = {k: v for k, v in row["tags"].items() if k not in (ORIGIN_TAG, SOURCE_TAG)}
    return {**row, "tags": tags, "feedback": feedback}


@pytest.mark.parametrize("fmt", sorted(FIXTURES))
def test_an_imported_history_round_trips_through_reef_export(
    stores: tuple[SQLExperienceStore, SQLExperienceStore], tmp_path: Path, fmt: str
) -> None:
    first, second = stores
    records, feedback, outcomes, skipped = FIXTURES[fmt]
    summary = run_import(first, DATA / f"{fmt}.jsonl", tmp_path / "a", fmt)
    assert (summary.records, summary.feedback, summary.skipped) == (
        records,
        feedback + outcomes,
        skipped,
    )
    before = exported(first)
    assert len(before) == records
    # a session's outcome travels on the line of the session's first record
    assert sum(len(row["feedback"]) for row in before) == feedback + outcomes
    assert {row["tags"][ORIGIN_TAG] for row in before} == {f"import:{fmt}"}
    dump = tmp_path / "dump.jsonl"
    export_records(first, "s", "reef", dump)

    again = run_import(second, dump, tmp_path / "b", "reef")
    assert (again.records, again.feedback, again.skipped) == (records, feedback + outcomes, 0)
    after = exported(second)
    assert [comparable(row) for row in after] == [comparable(row) for row in before]
    # the trip kept the source's ids, sessions and times, not only the text
    assert [row["idempotency_key"] for row in after] == [
        f"import:{fmt}:{row['tags'][SOURCE_TAG]}" for row in before
    ]
    assert [(row["session_id"], row["turn"], row["created_at"]) for row in after] == [
        (row["session_id"], row["turn"], row["created_at"]) for row in before
    ]
    # so the source file, imported where its export went, is still known there
    late = run_import(second, DATA / f"{fmt}.jsonl", tmp_path / "b", fmt)
    assert (late.records, late.duplicate_records) == (0, records)
    assert (late.feedback, late.duplicate_feedback) == (0, feedback + outcomes)
    assert len(exported(second)) == records
    assert [(f.score, f.session_id) for f in second.session_feedback("s")] == [
        (f.score, f.session_id) for f in first.session_feedback("s")
    ]


def test_openai_chat_lines_come_back_as_they_were(
    stores: tuple[SQLExperienceStore, SQLExperienceStore], tmp_path: Path
) -> None:
    first, _ = stores
    path = DATA / "openai-chat.jsonl"
    run_import(first, path, tmp_path, "openai-chat")
    by_source = {row["tags"][SOURCE_TAG]: row for row in exported(first)}
    for line in (json.loads(text) for text in path.read_text().splitlines()):
        if "request" in line:  # a request/response pair
            row = by_source[line["response"]["id"]]
            assert (row["request"], row["response"]) == (line["request"], line["response"])
        else:  # a stored ChatCompletion with its request's messages beside its choices
            row = by_source[line["id"]]
            request = {k: line[k] for k in ("model", "messages", "tools", "metadata") if k in line}
            response = {k: v for k, v in line.items() if k not in ("messages", "tools", "metadata")}
            assert (row["request"], row["response"]) == (request, response)
        created = datetime.fromtimestamp((line.get("response") or line)["created"], UTC)
        assert datetime.fromisoformat(row["created_at"]) == created
