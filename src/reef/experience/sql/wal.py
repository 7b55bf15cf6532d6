"""The record writer's SQLite connections, and checkpoints of the write-ahead log off the
event loop.

In WAL mode a commit appends its pages to the ``-wal`` file; a *checkpoint* copies them
into the database file and syncs both (with ``synchronous = NORMAL`` the only syncs
there are). Left to itself SQLite runs one inside the commit that takes the WAL past
``wal_autocheckpoint`` pages. The gateway commits records on its event loop (``sync``
durability, ``reef.experience.writer``), so that commit stalled the loop, and every
request in flight with it, for the copy and the syncs. Measured at concurrency 32 on the
2-core reference machine (``bench/gateway_overhead.py``, 2026-12-05): 15 of 1407 loop
commits checkpointed (4000 pages each), taking 20-40 ms apiece where a commit takes
~0.1-1 ms, the longest stalls of the loop and what made Reef's p99 there.

So the writer's connections turn autocheckpoint off, and a ``WalCheckpointer`` thread,
on a connection of its own, runs ``PRAGMA wal_checkpoint(PASSIVE)`` once the writer has
committed ``every_records`` records since its last pass (after ``interval_seconds`` at a
lower rate). PASSIVE takes no lock a writer waits for: commits go on appending while it
copies, and the first commit after a complete pass starts the WAL over from its
beginning, so the file stays near the pages written between two passes. A reader that
holds an old snapshot stops PASSIVE short of the end; when ``limit_pages`` frames are
left uncopied, the thread runs ``wal_checkpoint(TRUNCATE)`` instead (at most once every
``FALLBACK_SPACING_SECONDS``), which waits up to ``FALLBACK_WAIT_MS`` for such readers
and blocks new writers meanwhile: the event loop's writes, which never wait, go to the
writer thread then (``write_records_now`` answers ``None``) instead of stalling it.

Durability is unchanged: a record is committed when its frames are in the WAL, before
its answer, whoever copies them later; after a crash the next connection replays the WAL.

Several gateway processes on one file (``reef serve --workers N``) run one checkpointer
each. SQLite runs one checkpoint at a time per file: another process's PASSIVE meanwhile
answers busy at once, and one that comes later finds the frames already copied, so they
neither wait for each other nor copy a page twice.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time

from sqlalchemy.engine import Engine
from sqlalchemy.pool import PoolProxiedConnection

log = logging.getLogger(__name__)

CHECKPOINT_EVERY_RECORDS = 200
"""Records committed between two passes; a record is 5-10 WAL pages (its row and six
indexes; fewer each in batches), so the WAL stays at a few MB."""
CHECKPOINT_INTERVAL_SECONDS = 1.0
"""The longest the committed pages of a slower writer wait for a pass."""
LIMIT_PAGES = 10_000
"""Uncopied frames (40 MB of 4 KB pages) past which a pass waits for old readers."""
FALLBACK_WAIT_MS = 500
"""How long that wait may block writers (the writer thread waits longer: the store's
busy timeout), so a reader that never ends costs no failed write."""
FALLBACK_SPACING_SECONDS = 5.0


class OwnConnection:
    """A connection of the writer's own: tuned by the engine's connect hook, then
    detached from the pool (closing it closes it), opened on first use, with
    autocheckpoint off (``WalCheckpointer`` copies the WAL)."""

    def __init__(self, engine: Engine, busy_timeout_ms: int | None) -> None:
        self._engine = engine
        self._busy_timeout_ms = busy_timeout_ms  # None: the engine's
        self._raw: PoolProxiedConnection | None = None
        self._connection: sqlite3.Connection | None = None

    def get(self) -> sqlite3.Connection:
        if self._connection is None:
            raw = self._engine.raw_connection()
            connection: sqlite3.Connection = raw.driver_connection  # type: ignore[assignment]
            raw.detach()
            if self._busy_timeout_ms is not None:
                connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            connection.execute("PRAGMA wal_autocheckpoint = 0")
            self._raw, self._connection = raw, connection
        return self._connection

    def close(self) -> None:
        raw, self._raw, self._connection = self._raw, None, None
        if raw is not None:
            with contextlib.suppress(sqlite3.Error):  # a broken one: nothing more to lose
                raw.close()


class WalCheckpointer:
    """Copies the WAL into the database from a thread of its own (see module doc),
    started by the first ``committed`` call and stopped by ``close``."""

    def __init__(
        self,
        engine: Engine,
        every_records: int = CHECKPOINT_EVERY_RECORDS,
        interval_seconds: float = CHECKPOINT_INTERVAL_SECONDS,
        limit_pages: int = LIMIT_PAGES,
    ) -> None:
        self._own = OwnConnection(engine, FALLBACK_WAIT_MS)
        self._every = every_records
        self._interval = interval_seconds
        self._limit = limit_pages
        self._lock = threading.Lock()  # starting and stopping
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._uncopied = 0  # records committed since the last pass began
        self._next_fallback = 0.0
        self.passes = 0
        """Passes run (PASSIVE, and TRUNCATE after one that fell short)."""

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def committed(self, records: int) -> None:
        """Count ``records`` just committed; wake the thread when a pass is due. Cheap
        enough for every commit on the event loop: an addition and a comparison."""
        if self._thread is None:
            self._start()
        self._uncopied += records  # a count lost to a race only moves a pass
        if self._uncopied >= self._every and not self._wake.is_set():
            self._wake.set()

    def close(self) -> None:
        """Stop the thread (after the pass it is in) and close its connection; the next
        ``committed`` starts it again."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is None:
                return
            self._stopping = True
            self._wake.set()
        thread.join()
        with self._lock:
            self._stopping = False
            self._wake.clear()
            self._own.close()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            # Daemon: a process that forgets close() still exits; the WAL it leaves
            # holds every commit, and the next connection copies it.
            self._thread = threading.Thread(
                target=self._run, name="reef-wal-checkpointer", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            if self._stopping:
                return
            self._wake.clear()
            if self._uncopied == 0:
                continue
            self._uncopied = 0
            self._pass()

    def _pass(self) -> None:
        try:
            connection = self._own.get()
            _busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.passes += 1
            now = time.monotonic()
            if frames - copied >= self._limit and now >= self._next_fallback:
                self._next_fallback = now + FALLBACK_SPACING_SECONDS
                connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                self.passes += 1
        except sqlite3.Error as error:  # the file gone, disk full, ...: the next pass retries
            log.warning("WAL checkpoint failed: %s", error)
            self._own.close()
