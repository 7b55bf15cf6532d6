"""Sync records written on the event loop, one batch per loop turn: ``write_records_now``,
``RecordWriter.submit``'s loop batches and when they go to the writer thread instead,
and the SQLite writer's own connections."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from reef.experience import RecordDraft, RecordWriter, SQLExperienceStore, StoreUnavailableError
from tests.experience.conftest import DraftFactory, hold_write_lock
from tests.experience.test_writer import stored_ids
from tests.polling import eventually_async


class ThreadNotingStore(SQLExperienceStore):
    """The SQLite store, noting which thread each write ran on and what it returned."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.now_calls: list[tuple[int, list[str] | None]] = []
        self.queued_threads: list[int] = []

    def write_records_now(self, drafts: Sequence[RecordDraft]) -> list[str] | None:
        written = super().write_records_now(drafts)
        self.now_calls.append((threading.get_ident(), written))
        return written

    def write_records(self, drafts: Sequence[RecordDraft]) -> list[str]:
        self.queued_threads.append(threading.get_ident())
        return super().write_records(drafts)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'reef.db'}"
    store = SQLExperienceStore.from_url(url)
    store.migrate()
    store.close()
    return url


def test_write_records_now_writes_when_nothing_is_in_the_way(
    store: SQLExperienceStore, store_url: str, make_draft: DraftFactory
) -> None:
    first = make_draft(idempotency_key="k")
    again = make_draft(idempotency_key="k")
    if not store_url.startswith("sqlite"):
        # A PostgreSQL write is a network round trip: never done without waiting.
        assert store.write_records_now([first]) is None
        return
    assert store.write_records_now([first]) == [first.id]
    assert store.write_records_now([again]) == [first.id]  # same contract as write_records
    assert stored_ids(store_url) == {first.id}


def test_write_records_now_does_not_wait_for_another_writer(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = SQLExperienceStore.from_url(sqlite_url)  # busy timeout 10 s: waiting would show
    draft = make_draft()
    with hold_write_lock(sqlite_url):
        assert store.write_records_now([draft]) is None
    assert draft.id not in stored_ids(sqlite_url)
    assert store.write_records_now([draft]) == [draft.id]  # the lock is free again
    store.close()


def test_a_waiting_write_polls_for_the_lock_and_gets_it_once_let_go(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    # another process's writer (reef serve --workers N): the batch asks again until its
    # busy timeout, rather than failing or sleeping in SQLite's long steps
    store = SQLExperienceStore.from_url(sqlite_url)
    draft = make_draft()
    written: list[list[str]] = []
    thread = threading.Thread(target=lambda: written.append(store.write_records([draft])))
    with hold_write_lock(sqlite_url):
        thread.start()
        thread.join(timeout=0.2)
        assert thread.is_alive() and not written, "it waits while the lock is held"
    thread.join(timeout=10)
    assert written == [[draft.id]]
    assert stored_ids(sqlite_url) == {draft.id}
    store.close()


def test_the_writer_connection_recovers_after_a_failure_and_a_close(
    tmp_path: Path, make_draft: DraftFactory
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    store = SQLExperienceStore.from_url(url, busy_timeout_ms=20)
    store.migrate()
    with hold_write_lock(url), pytest.raises(StoreUnavailableError):
        store.write_records([make_draft()])
    kept = [make_draft()]
    assert store.write_records(kept) == [kept[0].id]
    store.close()
    later = [make_draft()]
    assert store.write_records(later) == [later[0].id]  # a closed store's writer reopens
    store.close()
    assert stored_ids(url) == {kept[0].id, later[0].id}


async def test_a_record_is_written_on_the_callers_thread(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="sync")
    writer.start()
    draft = make_draft()
    assert await writer.submit(draft) == draft.id
    assert store.now_calls == [(threading.get_ident(), [draft.id])]
    assert store.queued_threads == []
    assert (writer.stats.written_total, writer.stats.batches_total) == (1, 1)
    assert stored_ids(sqlite_url) == {draft.id}
    await writer.close()
    store.close()


async def test_records_submitted_in_one_loop_turn_are_one_batch(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="sync")
    writer.start()
    drafts = [make_draft() for _ in range(5)]
    assert await asyncio.gather(*(writer.submit(d) for d in drafts)) == [d.id for d in drafts]
    assert store.now_calls == [(threading.get_ident(), [d.id for d in drafts])]
    assert (writer.stats.batches_total, writer.stats.last_batch_size) == (1, 5)
    assert store.queued_threads == []
    await writer.close()
    store.close()


async def test_a_batch_that_fails_goes_to_the_thread_which_finds_the_culprit(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="sync")
    writer.start()
    good = [make_draft(), make_draft()]
    bad = make_draft(request={"not json": {1, 2}})  # a set: not JSON-serialisable
    submitted = (writer.submit(d) for d in [good[0], bad, good[1]])
    outcomes = await asyncio.gather(*submitted, return_exceptions=True)
    assert outcomes[0] == good[0].id and outcomes[2] == good[1].id
    assert isinstance(outcomes[1], Exception)
    assert store.queued_threads and threading.get_ident() not in store.queued_threads
    assert stored_ids(sqlite_url) == {good[0].id, good[1].id}
    await writer.close()
    store.close()


async def test_close_writes_a_batch_still_waiting_for_its_turn(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="sync")
    writer.start()
    draft = make_draft()
    pending = asyncio.ensure_future(writer.submit(draft))
    await asyncio.sleep(0)  # the submit joined this turn's batch; it is written next turn
    await writer.close()  # waits for it rather than ending the thread under it
    assert await pending == draft.id
    assert stored_ids(sqlite_url) == {draft.id}
    store.close()


async def test_a_record_is_queued_when_the_store_is_locked(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="sync")
    writer.start()
    draft = make_draft()
    with hold_write_lock(sqlite_url):
        task = asyncio.ensure_future(writer.submit(draft))
        await eventually_async(lambda: store.queued_threads, "the writer thread to try it")
        assert not task.done()  # sync durability: it waits for its commit
    assert await task == draft.id
    assert [written for _, written in store.now_calls] == [None]
    assert store.queued_threads and threading.get_ident() not in store.queued_threads
    assert stored_ids(sqlite_url) == {draft.id}
    await writer.close()
    store.close()


async def test_a_batch_waits_behind_records_queued_before_it(
    sqlite_url: str, make_draft: DraftFactory
) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="sync", max_batch=1)
    writer.start()
    earlier = [make_draft(), make_draft()]
    with hold_write_lock(sqlite_url):
        waiting = [asyncio.ensure_future(writer.submit(d)) for d in earlier]
        # The thread is stuck on the first; the second stays queued.
        await eventually_async(lambda: store.queued_threads, "the writer thread to try one")
        assert writer.stats.queue_depth == 1
        tried = len(store.now_calls)  # the earlier ones' own batch: tried, refused (locked)
        lone = make_draft()
        last = asyncio.ensure_future(writer.submit(lone))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # its batch's turn came
        assert len(store.now_calls) == tried  # never tried: the queue goes first
    assert await asyncio.gather(*waiting, last) == [*(d.id for d in earlier), lone.id]
    await writer.close()
    store.close()


async def test_async_durability_always_queues(sqlite_url: str, make_draft: DraftFactory) -> None:
    store = ThreadNotingStore.from_url(sqlite_url)
    writer = RecordWriter(store, durability="async")
    writer.start()
    draft = make_draft()
    assert await writer.submit(draft) == draft.id
    await writer.close()
    assert store.now_calls == []
    assert stored_ids(sqlite_url) == {draft.id}
    store.close()
