"""Listing with cursors and filters, and streaming export."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from reef.core.errors import InvalidInputError
from reef.experience import (
    FeedbackDraft,
    RecordFilter,
    RecordNotFoundError,
    SQLExperienceStore,
)
from reef.experience.sql import store as sql_module
from tests.experience.conftest import DraftFactory

T0 = datetime(2024, 3, 1, tzinfo=UTC)


def write_timeline(store: SQLExperienceStore, make_draft: DraftFactory, count: int) -> list[str]:
    """``count`` records one second apart, some sharing a timestamp to exercise tie-breaks."""
    drafts = [
        make_draft(
            session_id=f"s{i % 3}",
            purpose="eval" if i % 4 == 0 else "serve",
            created_at=T0 + timedelta(seconds=i // 2),
        )
        for i in range(count)
    ]
    store.write_records(drafts)
    return [d.id for d in drafts]


def all_pages(store: SQLExperienceStore, filters: RecordFilter, limit: int) -> list[str]:
    ids: list[str] = []
    cursor: str | None = None
    while True:
        page = store.list_records("support", filters, cursor, limit)
        assert len(page.records) <= limit
        ids += [r.id for r in page.records]
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


def newest_first(store: SQLExperienceStore, ids: list[str]) -> list[str]:
    views = [store.get_record(i) for i in ids]
    return [v.id for v in sorted(views, key=lambda v: (v.created_at, v.id), reverse=True)]


def test_pages_cover_everything_newest_first_without_repeats(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    ids = write_timeline(store, make_draft, 23)
    for limit in (1, 4, 23, 100):
        assert all_pages(store, RecordFilter(), limit) == newest_first(store, ids)
    page = store.list_records("support", RecordFilter(), None, 23)
    assert page.next_cursor is None


def test_each_filter_narrows_the_listing(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    ids = write_timeline(store, make_draft, 12)
    views = {i: store.get_record(i) for i in ids}
    scored = {ids[1]: 0.2, ids[2]: 0.9, ids[5]: None}
    for record_id, score in scored.items():
        store.add_feedback(
            FeedbackDraft("support", (record_id,), score, "note", None, {}, None, None)
        )
    store.add_feedback(FeedbackDraft("support", (ids[1],), 0.6, None, None, {}, None, None))

    def listed(filters: RecordFilter) -> set[str]:
        return set(all_pages(store, filters, 5))

    assert listed(RecordFilter(session_id="s1")) == {i for i in ids if views[i].session_id == "s1"}
    assert listed(RecordFilter(purpose="eval")) == {i for i in ids if views[i].purpose == "eval"}
    since = T0 + timedelta(seconds=3)
    assert listed(RecordFilter(since=since)) == {i for i in ids if views[i].created_at >= since}
    assert listed(RecordFilter(has_feedback=True)) == set(scored)
    assert listed(RecordFilter(has_feedback=False)) == set(ids) - set(scored)
    # Any feedback at or above the bar counts: ids[1] has 0.2 and 0.6.
    assert listed(RecordFilter(min_score=0.5)) == {ids[1], ids[2]}
    assert listed(RecordFilter(min_score=0.95)) == set()
    assert listed(RecordFilter(session_id="s2", has_feedback=True)) == {
        i for i in scored if views[i].session_id == "s2"
    }


def test_listing_is_per_scenario(store: SQLExperienceStore, make_draft: DraftFactory) -> None:
    store.write_records([make_draft(scenario="other")])
    assert store.list_records("support", RecordFilter(), None, 10).records == ()


def test_listing_attaches_feedback(store: SQLExperienceStore, make_draft: DraftFactory) -> None:
    draft = make_draft()
    store.write_records([draft])
    fid, _ = store.add_feedback(
        FeedbackDraft("support", (draft.id,), 1.0, None, None, {}, None, None)
    )
    (view,) = store.list_records("support", RecordFilter(), None, 10).records
    assert [f.id for f in view.feedback] == [fid]


@pytest.mark.parametrize("cursor", ["garbage", "", "WyJ4Il0"])
def test_bad_cursor_is_invalid_input(store: SQLExperienceStore, cursor: str) -> None:
    with pytest.raises(InvalidInputError, match="cursor"):
        store.list_records("support", RecordFilter(), cursor, 10)


@pytest.mark.parametrize("limit", [0, -1, 100_000])
def test_bad_limit_is_invalid_input(store: SQLExperienceStore, limit: int) -> None:
    with pytest.raises(InvalidInputError, match="limit"):
        store.list_records("support", RecordFilter(), None, limit)


def test_export_streams_oldest_first_across_batches(
    store: SQLExperienceStore,
    make_draft: DraftFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small batches so the keyset pagination crosses several batch boundaries.
    monkeypatch.setattr(sql_module, "EXPORT_BATCH", 4)
    ids = write_timeline(store, make_draft, 17)
    store.write_records([make_draft(scenario="other")])
    exported = list(store.iter_export("support"))
    assert [v.id for v in exported] == list(reversed(newest_first(store, ids)))


def test_export_since_a_timestamp_or_a_record(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    ids = write_timeline(store, make_draft, 10)
    ordered = list(reversed(newest_first(store, ids)))
    since = (T0 + timedelta(seconds=3)).isoformat()
    assert [v.id for v in store.iter_export("support", since)] == [
        i for i in ordered if store.get_record(i).created_at >= T0 + timedelta(seconds=3)
    ]
    assert [v.id for v in store.iter_export("support", ordered[4])] == ordered[5:]
    with pytest.raises(RecordNotFoundError):
        list(store.iter_export("support", "no-such-record"))
