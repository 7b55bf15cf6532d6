"""``import_file`` on a real store (SQLite; PostgreSQL with REEF_TEST_POSTGRES_URL):
each format read, round-tripped through ``export_records``, deduplicated on a second
import, redacted, and excluded from selection when a recipe says so."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.core import canonical_json
from reef.core.ids import new_id
from reef.experience import (
    ORIGIN_TAG,
    SOURCE_TAG,
    FeedbackDraft,
    ImportLineError,
    RecordDraft,
    RecordFilter,
    RecordView,
    Redactor,
    SQLExperienceStore,
    UnknownImportFormatError,
    export_records,
)
from reef.learning.selection import SelectionConfig, select_experience
from reef.releases import ReleaseChain
from tests.experience.conftest import (  # noqa: F401 - fixtures
    pg_databases,
    pg_url,
    store_url,
)
from tests.experience.importing_helpers import run_import

DATA = Path(__file__).resolve().parents[1] / "data" / "import"
FINETUNE = DATA / "openai-finetune.jsonl"
CHAT = DATA / "openai-chat.jsonl"


@pytest.fixture
def store(store_url: str) -> Iterator[SQLExperienceStore]:  # noqa: F811 - fixture
    opened = SQLExperienceStore.from_url(store_url)
    yield opened
    opened.close()


def records(store: SQLExperienceStore, scenario: str = "s") -> list[RecordView]:
    return list(store.iter_export(scenario))


def exported(store: SQLExperienceStore, fmt: str, scenario: str = "s") -> list[dict[str, Any]]:
    out = io.BytesIO()
    export_records(store, scenario, fmt, out)  # type: ignore[arg-type]
    return [json.loads(line) for line in out.getvalue().splitlines()]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def canonical_set(values: list[dict[str, Any]]) -> list[bytes]:
    return sorted(canonical_json(value) for value in values)


def test_openai_finetune_round_trips_and_demonstrations_are_operator_feedback(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    summary = run_import(store, FINETUNE, tmp_path, fmt="auto")
    assert summary.formats == {str(FINETUNE): "openai-finetune"}
    assert (summary.records, summary.feedback, summary.skipped) == (4, 4, 0)
    # The tool-call turn and its follow-up form one session; the other two stand alone.
    assert summary.sessions == 3
    stored = records(store)
    assert len({r.session_id for r in stored}) == 3
    for record in stored:
        assert record.tags[ORIGIN_TAG] == "import:openai-finetune"
        assert record.release_id is None
        (demo,) = record.feedback
        assert (demo.score, demo.trust, demo.principal) == (
            1.0,
            "operator",
            "import:openai-finetune",
        )
    assert canonical_set(exported(store, "openai-finetune")) == canonical_set(lines(FINETUNE))


def test_demo_trust_sets_the_trust_of_demonstrations(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    run_import(store, FINETUNE, tmp_path, demo_trust="user")
    assert {f.trust for r in records(store) for f in r.feedback} == {"user"}


def test_finetune_export_puts_the_correction_in_place_of_the_served_answer(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    run_import(store, FINETUNE, tmp_path)
    target = next(r for r in records(store) if "France" in json.dumps(r.request))
    store.add_feedback(
        FeedbackDraft(
            scenario="s",
            record_ids=(target.id,),
            score=0.0,
            feedback=None,
            correction="Paris.",
            metadata={},
            principal="editor",
            idempotency_key=None,
        )
    )
    france = next(line for line in exported(store, "openai-finetune") if "France" in str(line))
    assert france["messages"][-1] == {"role": "assistant", "content": "Paris."}


def test_openai_chat_pairs_and_stored_completions(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    summary = run_import(store, CHAT, tmp_path)
    assert summary.formats == {str(CHAT): "openai-chat"}
    assert (summary.records, summary.feedback, summary.skipped) == (4, 0, 0)
    by_source = {r.tags[SOURCE_TAG]: r for r in records(store)}
    source = lines(CHAT)
    first, tools = by_source[source[0]["response"]["id"]], by_source[source[1]["response"]["id"]]
    # The source's conversation id is the session; the order of turns is kept.
    assert first.session_id == tools.session_id == "conv-1"
    assert (first.turn, tools.turn) == (0, 1)
    assert tools.request == source[1]["request"] and tools.response == source[1]["response"]
    assert tools.created_at.timestamp() == source[1]["response"]["created"] == 1741569990
    # Without an id, the later stored completion joins the earlier one's session by its
    # conversation, as live traffic does.
    haiku, again = by_source["chatcmpl-stored-1"], by_source["chatcmpl-stored-2"]
    assert haiku.session_id == again.session_id != "conv-1"
    assert again.request["messages"] == source[3]["messages"]
    assert again.response is not None and "messages" not in again.response
    assert all(r.tags[ORIGIN_TAG] == "import:openai-chat" for r in by_source.values())


def test_reef_export_round_trips_with_feedback(tmp_path: Path) -> None:
    source = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'a.db'}", migrate=True)
    target = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'b.db'}", migrate=True)
    try:
        run_import(source, CHAT, tmp_path / "a")
        run_import(source, FINETUNE, tmp_path / "a")
        ids = [r.id for r in records(source)]
        source.add_feedback(
            FeedbackDraft(
                scenario="s",
                record_ids=(ids[0], ids[2]),
                score=0.5,
                feedback={"comment": "two at once"},
                correction={"tool_calls": [{"name": "lookup", "arguments": {"q": "x"}}]},
                metadata={"k": "v"},
                principal="grader",
                idempotency_key="fb-1",
                trust="user",
            )
        )
        # a session's outcome, naming no record: it travels with the session's first record
        session = records(source)[2].session_id
        source.add_feedback(
            FeedbackDraft(
                scenario="s",
                record_ids=(),
                score=0.0,
                feedback="the task failed",
                correction=None,
                metadata={},
                principal="grader",
                idempotency_key="outcome-1",
                trust="user",
                session_id=session,
            )
        )
        dump = tmp_path / "dump.jsonl"
        export_records(source, "s", "reef", dump)
        summary = run_import(target, dump, tmp_path / "b")
        assert summary.formats == {str(dump): "reef"}
        assert (summary.records, summary.skipped) == (8, 0)
        assert summary.feedback == 6
        before, after = exported(source, "reef"), exported(target, "reef")
        assert [_comparable(r) for r in after] == [_comparable(r) for r in before]
        assert {r["tags"][ORIGIN_TAG] for r in after} == {"import:reef"}
        redacted = io.BytesIO()
        export_records(source, "s", "reef", redacted, redactor=Redactor([r"failed"]))
        assert (
            b"the task [REDACTED]" in redacted.getvalue() and b"failed" not in redacted.getvalue()
        )
        (outcome,) = target.session_feedback("s", session)
        assert (outcome.record_ids, outcome.score, outcome.feedback) == ((), 0.0, "the task failed")
        assert (outcome.principal, outcome.trust, outcome.idempotency_key) == (
            "grader",
            "user",
            "outcome-1",
        )
    finally:
        source.close()
        target.close()


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A record as exported, less what the store mints (feedback ids and times) and the
    origin tags the import sets."""
    tags = {k: v for k, v in row["tags"].items() if k not in (ORIGIN_TAG, SOURCE_TAG)}
    feedback = [
        {k: v for k, v in f.items() if k not in ("id", "created_at")} for f in row["feedback"]
    ]
    return {**row, "tags": tags, "feedback": feedback}


def test_a_second_import_adds_nothing(store: SQLExperienceStore, tmp_path: Path) -> None:
    run_import(store, CHAT, tmp_path)
    run_import(store, FINETUNE, tmp_path)
    first = records(store)
    again = run_import(store, CHAT, tmp_path)
    again_ft = run_import(store, FINETUNE, tmp_path)
    assert (again.records, again.duplicate_records) == (0, 4)
    assert (again_ft.records, again_ft.feedback, again_ft.duplicate_feedback) == (0, 0, 4)
    assert [(r.id, len(r.feedback)) for r in records(store)] == [
        (r.id, len(r.feedback)) for r in first
    ]


def test_malformed_lines_are_skipped_with_their_numbers(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    good = FINETUNE.read_text().splitlines()
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([good[0], "{not json", "", '{"messages": []}', good[1]]) + "\n")
    summary = run_import(store, path, tmp_path, fmt="openai-finetune")
    assert summary.records == 2
    assert [(line, reason.split(":")[0]) for _, line, reason in summary.skips] == [
        (2, "not JSON"),
        (4, "no assistant message"),
    ]
    with pytest.raises(ImportLineError, match=r"mixed.jsonl:2: not JSON"):
        run_import(store, path, tmp_path, fmt="openai-finetune", strict=True)


def test_an_unknown_format_names_the_formats(store: SQLExperienceStore, tmp_path: Path) -> None:
    with pytest.raises(UnknownImportFormatError, match="reef, otel, openai-chat, openai-finetune"):
        run_import(store, CHAT, tmp_path, fmt="csv")
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"hello": "world"}\n')
    with pytest.raises(UnknownImportFormatError, match="cannot tell the format"):
        run_import(store, odd, tmp_path)


def test_redaction_applies_before_anything_is_stored(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    run_import(store, FINETUNE, tmp_path, redactor=Redactor([r"Shakespeare", r"Paris"]))
    text = json.dumps([(r.request, r.response) for r in records(store)])
    assert "Shakespeare" not in text and "Paris" not in text and "[REDACTED]" in text


def test_selection_can_exclude_imported_records(store: SQLExperienceStore, tmp_path: Path) -> None:
    run_import(store, FINETUNE, tmp_path)
    chain = ReleaseChain(store.database)
    kept = select_experience(store, chain, "s", SelectionConfig(holdout_fraction=0.0))
    assert len(kept.train) == 3  # the tool-call session's two turns are one example
    config = SelectionConfig(holdout_fraction=0.0, imported="exclude")
    excluded = select_experience(store, chain, "s", config)
    assert excluded.train == [] and excluded.stats["imported_excluded"] == 4


def test_refused_feedback_is_reported_and_the_rest_of_the_batch_kept(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    run_import(store, FINETUNE, tmp_path)
    line = exported(store, "reef")[0]
    good = {**line["feedback"][0], "id": "fb-good", "idempotency_key": None, "score": 0.25}
    lost = {**good, "id": "fb-lost", "record_ids": [], "session_id": "no-such-session"}
    line = {**line, "feedback": [lost, good]}
    path = tmp_path / "reef.jsonl"
    path.write_text(json.dumps(line) + "\n")
    summary = run_import(store, path, tmp_path, scenario="s")
    assert (summary.duplicate_records, summary.feedback) == (1, 1)
    ((_, line_no, reason),) = summary.skips
    assert line_no == 1 and reason.startswith("feedback fb-lost:") and "no-such-session" in reason
    scores = sorted(f.score or 0 for f in store.get_record(line["id"]).feedback)
    assert scores == [0.25, 1.0]


def test_a_line_repeated_in_one_file_is_one_record(
    store: SQLExperienceStore, tmp_path: Path
) -> None:
    first, second = FINETUNE.read_text().splitlines()[2:4]  # a tool call, then its follow-up
    path = tmp_path / "repeated.jsonl"
    path.write_text("\n".join([first, first, second]) + "\n")
    summary = run_import(store, path, tmp_path)
    assert (summary.records, summary.duplicate_records, summary.feedback) == (2, 1, 2)
    (only,) = {r.session_id for r in records(store)}  # the follow-up found the first
    assert only


def test_records_are_listed_by_origin(store: SQLExperienceStore, tmp_path: Path) -> None:
    run_import(store, CHAT, tmp_path)
    run_import(store, FINETUNE, tmp_path)
    # a live record, with a tag whose value merely mentions an origin
    live = RecordDraft(
        id=new_id(),
        scenario="s",
        session_id="live-1",
        api="openai.chat",
        request={"messages": [{"role": "user", "content": "hi"}]},
        response=None,
        status="error",
        error="boom",
        latency_ms=1.0,
        usage=None,
        release_id=None,
        prompt_hash="p",
        content_hash="c",
        continuation_hash=None,
        tags={"note": '"reef.origin":"import:openai-chat"'},
    )
    store.write_records([live])

    def listed(origin: str) -> set[str]:
        page = store.list_records("s", RecordFilter(origin=origin), None, 100)
        return {view.tags.get(ORIGIN_TAG, "live") for view in page.records}

    assert listed("import:openai-chat") == {"import:openai-chat"}
    assert (
        len(store.list_records("s", RecordFilter(origin="import:openai-chat"), None, 100).records)
        == 4
    )
    assert listed("import:openai-finetune") == {"import:openai-finetune"}
    assert listed("live") == {"live"}
    assert listed("import:reef") == set()
