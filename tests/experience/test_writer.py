"""RecordWriter: durability modes, draining, overflow policies and group commit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from reef.core.errors import InvalidInputError
from reef.core.retrying import RetryPolicy
from reef.experience import (
    RecordDraft,
    RecordWriter,
    SQLExperienceStore,
    StoreUnavailableError,
    WriterNotRunningError,
)
from reef.experience.writer import WRITE_RETRY
from tests.experience.conftest import DraftFactory, hold_write_lock
from tests.polling import eventually_async


def stored_ids(url: str) -> set[str]:
    """Ids in the store, read through a fresh store instance (nothing cached)."""
    fresh = SQLExperienceStore.from_url(url)
    try:
        return {v.id for v in fresh.iter_export("support")}
    finally:
        fresh.close()


@pytest.fixture
async def sync_writer(store: SQLExperienceStore) -> AsyncIterator[RecordWriter]:
    writer = RecordWriter(store, durability="sync", max_batch=256)
    writer.start()
    yield writer
    await writer.close()


async def test_sync_submit_returns_only_after_commit(
    sync_writer: RecordWriter, store_url: str, make_draft: DraftFactory
) -> None:
    for _ in range(3):
        draft = make_draft()
        assert await sync_writer.submit(draft) == draft.id
        assert draft.id in stored_ids(store_url)
    assert sync_writer.stats.written_total == 3


async def test_sync_submit_returns_the_stored_id_for_a_repeated_key(
    sync_writer: RecordWriter, make_draft: DraftFactory
) -> None:
    first = make_draft(idempotency_key="k")
    assert await sync_writer.submit(first) == first.id
    assert await sync_writer.submit(make_draft(idempotency_key="k")) == first.id


async def test_concurrent_submits_share_batches(
    sync_writer: RecordWriter, store_url: str, make_draft: DraftFactory
) -> None:
    drafts = [make_draft(session_id=f"s{i % 8}") for i in range(64)]
    ids = await asyncio.gather(*(sync_writer.submit(d) for d in drafts))
    assert ids == [d.id for d in drafts]
    stats = sync_writer.stats
    assert stats.written_total == 64
    assert stats.batches_total < 64
    assert stored_ids(store_url) == set(ids)


async def test_sync_submit_raises_the_error_of_its_own_record(
    sync_writer: RecordWriter, store_url: str, make_draft: DraftFactory
) -> None:
    good = [make_draft() for _ in range(5)]
    bad = make_draft(request={"not json": object()})
    results = await asyncio.gather(
        *(sync_writer.submit(d) for d in [*good[:2], bad, *good[2:]]), return_exceptions=True
    )
    assert isinstance(results[2], InvalidInputError)
    assert [r for i, r in enumerate(results) if i != 2] == [d.id for d in good]
    assert stored_ids(store_url) == {d.id for d in good}
    assert sync_writer.stats.failed_total == 1


async def test_async_close_drains_everything_queued(
    store: SQLExperienceStore, store_url: str, make_draft: DraftFactory
) -> None:
    writer = RecordWriter(store, durability="async", queue_size=1000, max_batch=50)
    writer.start()
    drafts = [make_draft() for _ in range(300)]
    with hold_write_lock(store_url):
        for draft in drafts:
            assert await writer.submit(draft) == draft.id
        assert writer.stats.queue_depth >= 250  # the writer is stuck on its first batch
        closing = asyncio.ensure_future(writer.close())
        await asyncio.sleep(0)
        assert not closing.done()
    await closing
    assert writer.stats.queue_depth == 0
    assert writer.stats.written_total == 300
    assert stored_ids(store_url) == {d.id for d in drafts}
    with pytest.raises(WriterNotRunningError):
        await writer.submit(make_draft())


async def test_drop_policy_drops_and_counts(
    store: SQLExperienceStore,
    store_url: str,
    make_draft: DraftFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = RecordWriter(store, durability="async", queue_size=2, overflow="drop", max_batch=1)
    writer.start()
    drafts = [make_draft() for _ in range(6)]
    with hold_write_lock(store_url):
        await writer.submit(drafts[0])
        await eventually_async(lambda: writer.stats.queue_depth == 0, "the writer to take it")
        for draft in drafts[1:]:
            await writer.submit(draft)
        assert writer.stats.dropped_total == 3
        assert writer.stats.queue_depth == 2
    await writer.close()
    assert stored_ids(store_url) == {d.id for d in drafts[:3]}
    assert writer.stats.written_total == 3
    # Rate-limited: one warning for the burst, not one per record.
    warnings = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1


async def test_block_policy_waits_for_room_and_counts(
    store: SQLExperienceStore, store_url: str, make_draft: DraftFactory
) -> None:
    writer = RecordWriter(store, durability="async", queue_size=2, overflow="block", max_batch=1)
    writer.start()
    drafts = [make_draft() for _ in range(5)]
    with hold_write_lock(store_url):
        await writer.submit(drafts[0])
        await eventually_async(lambda: writer.stats.queue_depth == 0, "the writer to take it")
        await writer.submit(drafts[1])
        await writer.submit(drafts[2])
        waiting = [asyncio.ensure_future(writer.submit(d)) for d in drafts[3:]]
        await asyncio.sleep(0)
        assert writer.stats.queue_full_total == 2
        assert not any(task.done() for task in waiting)
    assert await asyncio.gather(*waiting) == [d.id for d in drafts[3:]]
    await writer.close()
    assert writer.stats.dropped_total == 0
    assert stored_ids(store_url) == {d.id for d in drafts}


async def test_sync_mode_blocks_even_with_drop_policy(
    store: SQLExperienceStore, store_url: str, make_draft: DraftFactory
) -> None:
    writer = RecordWriter(store, durability="sync", queue_size=1, overflow="drop", max_batch=1)
    writer.start()
    drafts = [make_draft() for _ in range(3)]
    with hold_write_lock(store_url):
        tasks = [asyncio.ensure_future(writer.submit(d)) for d in drafts]
        await eventually_async(lambda: writer.stats.queue_full_total >= 1, "a full queue")
    assert await asyncio.gather(*tasks) == [d.id for d in drafts]
    await writer.close()
    assert writer.stats.dropped_total == 0


async def test_async_failures_are_retried_then_counted(
    tmp_path: Path, make_draft: DraftFactory, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = SQLExperienceStore.from_url(url, busy_timeout_ms=20)
    store.migrate()
    retry = RetryPolicy(retries=2, base_seconds=0.01, cap_seconds=0.01)
    writer = RecordWriter(store, durability="async", retry=retry)
    writer.start()
    lost = make_draft()
    with hold_write_lock(url):
        await writer.submit(lost)
        await eventually_async(lambda: writer.stats.failed_total == 1, "the write to fail")
    kept = make_draft()
    await writer.submit(kept)
    await writer.close()
    store.close()
    assert writer.stats.failed_total == 1
    assert writer.stats.written_total == 1
    assert stored_ids(url) == {kept.id}
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2
    assert any(r.levelname == "ERROR" and "lost 1 record" in r.getMessage() for r in caplog.records)


def test_the_default_write_retry_keeps_four_retries_up_to_four_seconds(tmp_path: Path) -> None:
    # The fixed (0.05, 0.25, 1.0, 4.0) schedule became a RetryPolicy: as many retries,
    # the longest wait no longer than before.
    assert WRITE_RETRY.retries == 4
    assert [WRITE_RETRY.ceiling(n) for n in range(4)] == [0.5, 1.0, 2.0, 4.0]
    store = SQLExperienceStore.from_url(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        with pytest.raises(TypeError, match=r"RetryPolicy.*retry_delays"):
            RecordWriter(store, retry=cast(Any, (0.05, 0.25)))
    finally:
        store.close()


async def test_sync_failure_raises_store_unavailable(
    tmp_path: Path, make_draft: DraftFactory
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = SQLExperienceStore.from_url(url, busy_timeout_ms=20)
    store.migrate()
    writer = RecordWriter(store, durability="sync")
    writer.start()
    with hold_write_lock(url), pytest.raises(StoreUnavailableError):
        await writer.submit(make_draft())
    with hold_write_lock(url), pytest.raises(StoreUnavailableError):
        store.ping()
    await writer.close()
    store.close()


async def test_flush_waits_for_queued_records(
    store: SQLExperienceStore, store_url: str, make_draft: DraftFactory
) -> None:
    writer = RecordWriter(store, durability="async")
    writer.start()
    drafts = [make_draft() for _ in range(20)]
    with hold_write_lock(store_url):
        for draft in drafts:
            await writer.submit(draft)
        flushing = asyncio.ensure_future(writer.flush())
        await asyncio.sleep(0)
        assert not flushing.done()
    await flushing
    assert stored_ids(store_url) == {d.id for d in drafts}
    await writer.close()


async def test_submit_before_start_is_refused(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    writer = RecordWriter(store)
    with pytest.raises(WriterNotRunningError, match="not started"):
        await writer.submit(make_draft())


def test_submit_blocking_from_threads(
    store: SQLExperienceStore, store_url: str, make_draft: DraftFactory
) -> None:
    writer = RecordWriter(store, durability="sync")
    writer.start()
    drafts = [make_draft(session_id=f"s{i}") for i in range(40)]
    results: dict[str, str] = {}

    def submit_all(part: list[RecordDraft]) -> None:
        for draft in part:
            results[draft.id] = writer.submit_blocking(draft)

    threads = [threading.Thread(target=submit_all, args=(drafts[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close_blocking()
    assert results == {d.id: d.id for d in drafts}
    assert stored_ids(store_url) == set(results)
