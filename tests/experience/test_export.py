"""Export to JSON Lines and Parquet, read back."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from reef.core import loads
from reef.core.errors import InvalidInputError
from reef.experience import FeedbackDraft, SQLExperienceStore, export_records
from reef.experience.export import record_dict
from tests.experience.conftest import DraftFactory

T0 = datetime(2024, 6, 1, tzinfo=UTC)


@pytest.fixture
def exported_ids(store: SQLExperienceStore, make_draft: DraftFactory) -> list[str]:
    drafts = [
        make_draft(
            created_at=T0 + timedelta(seconds=i),
            tags={"i": str(i)},
            response=None if i == 2 else {"text": f"reply {i}"},
        )
        for i in range(5)
    ]
    store.write_records(drafts)
    store.write_records([make_draft(scenario="not-exported")])
    store.add_feedback(
        FeedbackDraft(
            "support",
            (drafts[1].id, drafts[3].id),
            0.5,
            {"why": "ok"},
            "fixed",
            {"m": 1},
            "grader",
            "fb",
        )
    )
    return [d.id for d in drafts]


def test_jsonl_export_round_trips(
    store: SQLExperienceStore, exported_ids: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "out.jsonl"
    assert export_records(store, "support", "jsonl", path) == 5

    rows = [loads(line) for line in path.read_bytes().splitlines()]
    assert [row["id"] for row in rows] == exported_ids
    assert rows == [record_dict(store.get_record(i)) for i in exported_ids]
    assert rows[1]["feedback"][0]["record_ids"] == [exported_ids[1], exported_ids[3]]
    assert rows[1]["feedback"][0]["correction"] == "fixed"
    assert rows[0]["feedback"] == []
    assert rows[2]["response"] is None


def test_jsonl_export_to_a_stream_leaves_it_open(
    store: SQLExperienceStore, exported_ids: list[str]
) -> None:
    stream = io.BytesIO()
    assert export_records(store, "support", "jsonl", stream, since=exported_ids[2]) == 2
    assert not stream.closed
    assert [loads(line)["id"] for line in stream.getvalue().splitlines()] == exported_ids[3:]


def test_parquet_export_round_trips(
    store: SQLExperienceStore, exported_ids: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "out.parquet"
    assert export_records(store, "support", "parquet", path) == 5

    rows = pq.read_table(path).to_pylist()
    assert [row["id"] for row in rows] == exported_ids
    for row, record_id in zip(rows, exported_ids, strict=True):
        view = store.get_record(record_id)
        assert row["created_at"] == view.created_at
        assert loads(row["request_json"]) == view.request
        assert (None if row["response_json"] is None else loads(row["response_json"])) == (
            view.response
        )
        assert dict(row["tags"]) == view.tags
        assert (row["turn"], row["session_id"], row["purpose"]) == (
            view.turn,
            view.session_id,
            view.purpose,
        )
        assert [f["id"] for f in row["feedback"]] == [f.id for f in view.feedback]
    feedback = rows[3]["feedback"][0]
    assert feedback["score"] == 0.5
    assert loads(feedback["feedback_json"]) == {"why": "ok"}
    assert loads(feedback["metadata_json"]) == {"m": 1}
    assert feedback["record_ids"] == [exported_ids[1], exported_ids[3]]


def test_parquet_export_of_nothing_is_a_valid_empty_file(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    path = tmp_path / "empty.parquet"
    assert export_records(store, "nobody", "parquet", path) == 0
    table = pq.read_table(path)
    assert table.num_rows == 0
    assert "feedback" in table.column_names


def test_unknown_format_is_invalid(store: SQLExperienceStore, tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="csv"):
        export_records(store, "support", "csv", tmp_path / "x")  # type: ignore[arg-type]
