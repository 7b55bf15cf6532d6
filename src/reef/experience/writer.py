"""``RecordWriter``: group commit of records from many requests into few transactions.

One dedicated thread takes whatever is queued (up to ``max_batch``) and writes it with a
single ``ExperienceStore.write_records`` call, so under load a commit carries many
records and its fsync is shared. Requests on an asyncio loop are woken with one
``loop.call_soon_threadsafe`` per loop per batch, never one per record.

In ``sync`` durability the records an event loop submits within one turn of the loop are
first gathered into a *loop batch*, written together on the loop itself once the
callbacks already scheduled have run (``loop.call_soon``) — when the store can do that
without waiting for anyone (``ExperienceStore.write_records_now``: SQLite, its write
lock free, nothing queued here). That skips the hand-off to the thread and back (two
thread wake-ups and the GIL changing hands, which cost more than the commit and, on a
busy machine, can each wait a scheduler tick for a core): measured at concurrency 32,
Reef's CPU per request fell by about a sixth. Otherwise, or when the batch fails, the
loop batch is queued for the thread like any other records (the thread retries, or
finds the records at fault one by one).

``durability="sync"``: ``submit`` returns once the batch holding the record committed, and
raises the store's error if it failed. A full queue always blocks in this mode (dropping
a record while promising it is durable would be a lie).
``durability="async"``: ``submit`` returns as soon as the record is queued; a batch the
store could not take (``StoreUnavailableError``) is retried under ``retry``, a
``reef.core.retrying.RetryPolicy`` (default ``WRITE_RETRY``: four retries, full-jitter
waits below 0.5, 1, 2 and 4 s), then logged and counted in ``failed_total``. A full queue
blocks or drops the record, as ``overflow`` says.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from reef.core.retrying import Retrier, RetryPolicy
from reef.experience.errors import StoreUnavailableError, WriterNotRunningError
from reef.experience.records import RecordDraft
from reef.experience.store import ExperienceStore

log = logging.getLogger(__name__)

Durability = Literal["sync", "async"]
Overflow = Literal["block", "drop"]
Outcome = str | BaseException

WRITE_RETRY = RetryPolicy(retries=4, base_seconds=0.5, cap_seconds=4.0)
"""How an async writer retries a batch the store could not take: four retries, the
longest wait at most 4 s, as the fixed 0.05/0.25/1/4 s schedule it replaces, jittered so
that gateways sharing a database that comes back do not all write at once."""
DROP_LOG_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True)
class WriterStats:
    """A consistent snapshot of the writer's counters."""

    queue_depth: int
    written_total: int
    batches_total: int
    dropped_total: int
    queue_full_total: int
    failed_total: int
    last_batch_size: int


class _Requeue(Exception):
    """Tells a sync submitter its loop batch was not written at once: queue it."""


class _Item:
    """A queued draft and whoever waits for its outcome (nobody in async mode)."""

    __slots__ = ("draft", "future", "loop", "seq", "thread_future")

    def __init__(
        self,
        draft: RecordDraft,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future[str] | None = None,
        thread_future: concurrent.futures.Future[str] | None = None,
    ) -> None:
        self.draft = draft
        self.loop = loop
        self.future = future
        self.thread_future = thread_future
        self.seq = 0


def _settle(futures: Sequence[tuple[asyncio.Future[str], Outcome]]) -> None:
    """Runs on the waiters' loop: one call settles every future of a batch."""
    for future, outcome in futures:
        if future.done():  # the request was cancelled meanwhile
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _signal(
    loop: asyncio.AbstractEventLoop, settled: list[tuple[asyncio.Future[str], Outcome]]
) -> None:
    # A closed loop raises RuntimeError: nobody is waiting there any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_settle, settled)


class RecordWriter:
    """Queues records and commits them in batches from one thread (see module doc)."""

    def __init__(
        self,
        store: ExperienceStore,
        durability: Durability = "sync",
        queue_size: int = 10_000,
        overflow: Overflow = "block",
        max_batch: int = 256,
        retry: RetryPolicy = WRITE_RETRY,
    ) -> None:
        if queue_size < 1 or max_batch < 1:
            raise ValueError("queue_size and max_batch must be positive")
        if not isinstance(retry, RetryPolicy):
            raise TypeError(
                "RecordWriter's retry must be a reef.core.retrying.RetryPolicy (the fixed "
                "retry_delays schedule it replaced is gone), not "
                f"{type(retry).__name__}: e.g. RetryPolicy(retries=4, base_seconds=0.5, "
                "cap_seconds=4.0)"
            )
        self._store = store
        self._durability = durability
        self._queue_size = queue_size
        self._overflow = overflow
        self._max_batch = max_batch
        self._retry = retry
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._has_room = threading.Condition(self._lock)
        self._queue: deque[_Item] = deque()
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[str]]] = []
        self._flush_waiters: list[tuple[int, asyncio.AbstractEventLoop, asyncio.Future[str]]] = []
        self._blocked = 0  # submitters waiting for room; close() lets them in first
        self._enqueued_seq = 0
        self._done_seq = 0
        self._thread: threading.Thread | None = None
        self._closing = False
        self._written = self._batches = self._dropped = self._full = self._failed = 0
        self._last_batch = 0
        self._drops_unlogged = 0
        self._last_drop_log = float("-inf")
        # Sync mode: each loop's records of this turn, written together (module doc).
        self._loop_batches: dict[asyncio.AbstractEventLoop, list[_Item]] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the writer thread; a second call does nothing."""
        with self._lock:
            if self._closing:
                raise WriterNotRunningError("record writer is closed")
            if self._thread is None:
                # Daemon, so a process that forgets close() can still exit; close() is
                # what guarantees the queue is written.
                self._thread = threading.Thread(
                    target=self._run, name="reef-record-writer", daemon=True
                )
                self._thread.start()

    async def close(self) -> None:
        """Stop accepting records, write everything already queued, stop the thread."""
        thread = self._begin_close()
        if thread is not None:
            await asyncio.to_thread(thread.join)

    stop = close

    def close_blocking(self) -> None:
        """``close`` for callers without an event loop."""
        thread = self._begin_close()
        if thread is not None:
            thread.join()

    def _begin_close(self) -> threading.Thread | None:
        with self._lock:
            self._closing = True
            # A loop batch whose loop closed before writing it: the thread writes it.
            for loop in [loop for loop in self._loop_batches if loop.is_closed()]:
                for item in self._loop_batches.pop(loop):
                    self._append(item, waited=False)
                self._blocked -= 1
            self._has_work.notify_all()
            return self._thread

    @property
    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(
                queue_depth=len(self._queue),
                written_total=self._written,
                batches_total=self._batches,
                dropped_total=self._dropped,
                queue_full_total=self._full,
                failed_total=self._failed,
                last_batch_size=self._last_batch,
            )

    # -- submitting --------------------------------------------------------------------

    async def submit(self, draft: RecordDraft) -> str:
        """Write ``draft`` (sync: in this loop turn's batch; async: queued); return its
        stored id once it is committed (sync) or queued (async).

        Raises ``WriterNotRunningError`` before ``start()`` or after ``close()``, and in
        sync mode whatever the store raised for the record.
        """
        loop = asyncio.get_running_loop()
        if self._durability == "async":
            await self._enqueue(_Item(draft, loop=loop), loop, counted=False)
            return draft.id
        future: asyncio.Future[str] = loop.create_future()
        with self._lock:
            self._check_open(waited=False)
            batch = self._loop_batches.get(loop)
            if batch is None:
                batch = self._loop_batches[loop] = []
                self._blocked += 1  # like a blocked submitter: close() lets it in first
                loop.call_soon(self._write_loop_batch, loop)
            batch.append(_Item(draft, loop=loop, future=future))
        try:
            return await future
        except _Requeue:
            pass  # the loop batch could not be written at once: queue it, as ever
        queued: asyncio.Future[str] = loop.create_future()
        await self._enqueue(_Item(draft, loop=loop, future=queued), loop, counted=True)
        return await queued

    async def _enqueue(self, item: _Item, loop: asyncio.AbstractEventLoop, counted: bool) -> None:
        """Put ``item`` on the thread's queue, waiting for room while it is full (async
        ``drop``: dropped instead). ``counted``: it is already counted among the blocked
        submitters (a loop batch handed back), whom ``close()`` lets in first."""
        waited, full = counted, False
        while True:
            with self._lock:
                self._check_open(waited)
                if len(self._queue) < self._queue_size:
                    self._append(item, waited)
                    return
                if self._drops_when_full():
                    self._drop(item.draft)
                    return
                if not full:
                    self._full += 1
                    full = True
                if not waited:
                    self._blocked += 1
                    waited = True
                room = loop.create_future()
                self._room_waiters.append((loop, room))
            try:
                await room
            except BaseException:
                self._leave_blocked()
                raise

    def _write_loop_batch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Runs on ``loop``: write its batch at once if the store can without waiting
        and nothing is queued before it; else hand each record back to its submitter,
        which queues it for the thread (counted as blocked until then)."""
        with self._lock:
            batch = self._loop_batches.pop(loop)
            queued = bool(self._queue)
        written: list[str] | None = None
        if not queued:
            try:
                written = self._store.write_records_now([item.draft for item in batch])
            except Exception as error:  # the thread retries it, or finds the culprit
                log.debug("a loop batch of %d failed (%s); queued", len(batch), error)
        with self._lock:
            if written is None:
                waiting = [item for item in batch if item.future and not item.future.done()]
                self._blocked += len(waiting)  # each until its submitter has queued it
                for item in batch:
                    if item not in waiting:  # its submitter is gone: the record is not
                        self._append(_Item(item.draft), waited=False)
            else:
                self._count_batch(len(batch), failed=0)
            self._leave_blocked_locked()
        if written is None:
            for item in waiting:
                assert item.future is not None
                item.future.set_exception(_Requeue())
            return
        _settle(
            [
                (item.future, stored)
                for item, stored in zip(batch, written, strict=True)
                if item.future is not None
            ]
        )

    def _count_batch(self, size: int, failed: int) -> None:
        """Count one written batch. Called under the lock."""
        self._batches += 1
        self._last_batch = size
        self._written += size - failed
        self._failed += failed

    def submit_blocking(self, draft: RecordDraft) -> str:
        """``submit`` for threads without an event loop; blocks the calling thread."""
        thread_future: concurrent.futures.Future[str] | None = None
        if self._durability == "sync":
            thread_future = concurrent.futures.Future()
        item = _Item(draft, thread_future=thread_future)
        with self._lock:
            self._check_open(waited=False)
            if len(self._queue) >= self._queue_size:
                if self._drops_when_full():
                    self._drop(draft)
                    return draft.id
                self._full += 1
                self._blocked += 1
                try:
                    while len(self._queue) >= self._queue_size:
                        self._has_room.wait()
                finally:
                    self._blocked -= 1
            self._append(item, waited=False)
        if thread_future is None:
            return draft.id
        return thread_future.result()

    async def flush(self) -> None:
        """Wait until every record queued before this call was written (or failed)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            target = self._enqueued_seq
            if self._done_seq >= target:
                return
            done = loop.create_future()
            self._flush_waiters.append((target, loop, done))
        await done

    def _check_open(self, waited: bool) -> None:
        # A submitter already waiting for room when close() began is still let in.
        if self._thread is None:
            raise WriterNotRunningError("record writer is not started")
        if self._closing and not waited:
            raise WriterNotRunningError("record writer is closed")

    def _drops_when_full(self) -> bool:
        return self._durability == "async" and self._overflow == "drop"

    def _append(self, item: _Item, waited: bool) -> None:
        self._enqueued_seq += 1
        item.seq = self._enqueued_seq
        self._queue.append(item)
        if waited:
            self._blocked -= 1
        self._has_work.notify()

    def _leave_blocked(self) -> None:
        with self._lock:
            self._leave_blocked_locked()

    def _leave_blocked_locked(self) -> None:
        """One blocked submitter fewer. The thread waits for records or, when closing,
        for no one blocked: only the last one out wakes it (waking it for nothing at
        every loop batch hands it the GIL for nothing). Called under the lock."""
        self._blocked -= 1
        if self._closing and self._blocked == 0:
            self._has_work.notify()

    def _drop(self, draft: RecordDraft) -> None:
        """Count a dropped record; warn at most once per interval. Called under the lock."""
        self._dropped += 1
        self._drops_unlogged += 1
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL_SECONDS:
            log.warning(
                "capture queue full (%d): dropped %d record(s), latest %s; %d dropped in total",
                self._queue_size,
                self._drops_unlogged,
                draft.id,
                self._dropped,
            )
            self._last_drop_log = now
            self._drops_unlogged = 0

    # -- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not (self._closing and self._blocked == 0):
                    self._has_work.wait()
                if not self._queue:
                    return
                count = min(len(self._queue), self._max_batch)
                batch = [self._queue.popleft() for _ in range(count)]
                room_waiters, self._room_waiters = self._room_waiters, []
                self._has_room.notify_all()
            # Producers refill the queue while this batch is being written.
            self._wake_room(room_waiters)
            outcomes = self._write(batch)
            self._finish(batch, outcomes)

    def _wake_room(
        self, waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[str]]]
    ) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[str], Outcome]]]
        by_loop = defaultdict(list)
        for loop, room in waiters:
            by_loop[loop].append((room, ""))
        for loop, settled in by_loop.items():
            _signal(loop, settled)

    def _write(self, batch: list[_Item]) -> list[Outcome]:
        drafts = [item.draft for item in batch]
        # Sync submitters are waiting: they get the store's error at once.
        retry = self._retry if self._durability == "async" else RetryPolicy(0, 0.0, 0.0)
        retrier = Retrier(retry)
        while True:
            try:
                return list(self._store.write_records(drafts))
            except StoreUnavailableError as error:
                delay = retrier.delay()
                if delay is None:
                    return [error] * len(batch)
                log.warning(
                    "writing %d record(s) failed, retrying in %.2fs: %s", len(batch), delay, error
                )
                time.sleep(delay)
            except Exception as error:
                if len(batch) == 1:
                    return [error]
                # Not the database's fault: find the record(s) at fault instead of
                # failing every request that happened to share the batch.
                log.warning(
                    "batch of %d records failed (%s); writing them one by one", len(batch), error
                )
                return [self._write_one(draft) for draft in drafts]

    def _write_one(self, draft: RecordDraft) -> Outcome:
        try:
            return self._store.write_records([draft])[0]
        except Exception as error:
            return error

    def _finish(self, batch: list[_Item], outcomes: list[Outcome]) -> None:
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors and self._durability == "async":
            log.error("lost %d record(s) after retries: %r", len(errors), errors[0])
        with self._lock:
            self._count_batch(len(batch), len(errors))
            self._done_seq = batch[-1].seq
            flushed = [w for w in self._flush_waiters if w[0] <= self._done_seq]
            self._flush_waiters = [w for w in self._flush_waiters if w[0] > self._done_seq]
        # Counters first, so a caller that was just woken sees its record counted.
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[str], Outcome]]]
        by_loop = defaultdict(list)
        for item, outcome in zip(batch, outcomes, strict=True):
            if item.future is not None and item.loop is not None:
                by_loop[item.loop].append((item.future, outcome))
            elif item.thread_future is not None:
                if isinstance(outcome, BaseException):
                    item.thread_future.set_exception(outcome)
                else:
                    item.thread_future.set_result(outcome)
        for _target, loop, done in flushed:
            by_loop[loop].append((done, ""))
        for loop, settled in by_loop.items():
            _signal(loop, settled)
