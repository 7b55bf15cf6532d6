"""The record writer's SQLite connections, and checkpoints of the write-ahead log off the
event loop.

In WAL mode a commit appends its pages to the ``-wal`` file; a *checkpoint* copies them
into the database file and syncs both (with ``synchronous = NORMAL`` the only syncs
there are). Left to itself SQLite runs one inside the commit that takes the WAL past
``wal_autocheckpoint`` pages. The gateway commits records on its event loop (``sync``
durability, ``reef.experience.writer``), so that commit stalled the loop, and every
request in flight with it, for the copy and the syncs. Measured at concurrency 32 on the
2-core reference machine (``bench/gateway_overhead.py``, 2026-12-05, 13 runs): 15 of
~1400 loop commits per run checkpointed (4000 pages each), taking 18-59 ms apiece where a
commit takes ~0.1-1 ms, the longest stalls of the loop and what made Reef's p99 there.

So the writer's connections turn autocheckpoint off, and a ``WalCheckpointer`` thread,
on a connection of its own, runs ``PRAGMA wal_checkpoint(PASSIVE)`` once the writer has
committed ``every_records`` records since its last pass (after ``interval_seconds`` at a
lower rate). PASSIVE takes no lock a writer waits for: commits go on appending while it
copies and syncs. But the WAL starts over from its beginning only at a write that finds
every frame copied, which under steady load never happens (measured: 62000 pages, 250
MB, after 13200 records). So once the WAL holds ``limit_pages`` frames and a PASSIVE pass
copied all it found (no reader keeps an older snapshot), the thread takes the writer's
lock, so this process's commits wait for it (the event loop's hand their records to the
writer thread instead of stalling the loop), and runs ``wal_checkpoint(RESTART)``: it
copies what came since the PASSIVE pass (a few hundred frames) and syncs, 7-27 ms in
the gateway bench on a loaded machine, blocking other processes' writers too, which is
what lets the next commit start the WAL over. ``limit_pages`` is large (128 MB) so that
this comes every several thousand records, not for every hundredth answer. A reader
that keeps an old snapshot stops any checkpoint short; the WAL then grows until it
ends, as with SQLite's own checkpoints, and the writer's ``journal_size_limit`` trims
the file at the next start-over.

Durability is unchanged: a record is committed when its frames are in the WAL, before
its answer, whoever copies them later; after a crash the next connection replays the WAL.

Several gateway processes on one file (``reef serve --workers N``) run one checkpointer
each. SQLite runs one checkpoint at a time per file: another process's PASSIVE meanwhile
answers busy at once, and one that comes later finds the frames already copied, so they
neither wait for each other nor copy a page twice; the one whose WAL passes the limit
restarts it for all.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading

from sqlalchemy.engine import Engine
from sqlalchemy.pool import PoolProxiedConnection

log = logging.getLogger(__name__)

CHECKPOINT_EVERY_RECORDS = 200
"""Records committed between two PASSIVE passes; a record is 5-10 WAL pages (its row and
five indexes; fewer each in batches)."""
CHECKPOINT_INTERVAL_SECONDS = 1.0
"""The longest the committed pages of a slower writer wait for a pass."""
LIMIT_PAGES = 32_768
"""WAL frames (128 MB of 4 KB pages) past which a pass restarts the WAL. A restart holds
up the commits of the requests in flight (all 32 at concurrency 32) for 7-27 ms; at
16384 pages it came every ~3500 records of the gateway bench, often enough to reach
the p99 of a 2000-request round, at this size about half as often."""
WAL_SIZE_LIMIT_BYTES = 2 * LIMIT_PAGES * 4096
"""``journal_size_limit`` of the writer's connections: a WAL file grown past it (while a
reader held an old snapshot) is trimmed back to it when the WAL starts over."""
RESTART_WAIT_MS = 100
"""The checkpointer's busy timeout: how long a restart may wait for another process's
write or a reader (then it gives up until the next pass), holding up writers meanwhile."""


class OwnConnection:
    """A connection of the writer's own: tuned by the engine's connect hook, then
    detached from the pool (closing it closes it), opened on first use, with
    autocheckpoint off (``WalCheckpointer`` copies the WAL)."""

    def __init__(self, engine: Engine, busy_timeout_ms: int | None) -> None:
        self._engine = engine
        self._busy_timeout_ms = busy_timeout_ms  # None: the engine's
        self._raw: PoolProxiedConnection | None = None
        self._connection: sqlite3.Connection | None = None
        self.engine_busy_timeout_ms = 0  # the engine's, read when the connection opens

    def get(self) -> sqlite3.Connection:
        if self._connection is None:
            raw = self._engine.raw_connection()
            connection: sqlite3.Connection = raw.driver_connection  # type: ignore[assignment]
            raw.detach()
            (self.engine_busy_timeout_ms,) = connection.execute("PRAGMA busy_timeout").fetchone()
            if self._busy_timeout_ms is not None:
                connection.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            connection.execute("PRAGMA wal_autocheckpoint = 0")
            connection.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
            self._raw, self._connection = raw, connection
        return self._connection

    def close(self) -> None:
        raw, self._raw, self._connection = self._raw, None, None
        if raw is not None:
            with contextlib.suppress(sqlite3.Error):  # a broken one: nothing more to lose
                raw.close()


class WalCheckpointer:
    """Copies the WAL into the database from a thread of its own (see module doc),
    started by the first ``committed`` call and stopped by ``close``. ``hold`` is the
    writer's lock, which the thread holds while it restarts the WAL."""

    def __init__(
        self,
        engine: Engine,
        hold: threading.Lock,
        every_records: int = CHECKPOINT_EVERY_RECORDS,
        interval_seconds: float = CHECKPOINT_INTERVAL_SECONDS,
        limit_pages: int = LIMIT_PAGES,
    ) -> None:
        self._engine = engine
        self._hold = hold
        self._every = every_records
        self._interval = interval_seconds
        self._limit = limit_pages
        self._lock = threading.Lock()  # starting and stopping
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stop: threading.Event | None = None  # the running thread's
        self._uncopied = 0  # records committed since the last pass began
        self.passes = 0
        """PASSIVE passes run."""
        self.restarts = 0
        """RESTART checkpoints that completed (the next commit starts the WAL over)."""

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def committed(self, records: int) -> None:
        """Count ``records`` just committed; wake the thread when a pass is due. Called
        under the writer's lock, on every commit, the event loop's included: an addition
        and a comparison."""
        if self._thread is None:
            self._start()
        self._uncopied += records  # a count lost to a race only moves a pass
        if self._uncopied >= self._every and not self._wake.is_set():
            self._wake.set()

    def stop(self) -> threading.Thread | None:
        """Ask the thread to stop after the pass it is in; called under the writer's lock
        (so it never waits for a restart of the thread's). ``join`` it afterwards, with
        the lock released; a ``committed`` meanwhile starts another thread."""
        with self._lock:
            thread, stop = self._thread, self._stop
            self._thread = self._stop = None
        if stop is not None:
            stop.set()
            self._wake.set()
        return thread

    def join(self, thread: threading.Thread | None) -> None:
        """Wait for a stopped thread to end (it closes its connection)."""
        if thread is not None:
            thread.join()

    def close(self) -> None:
        """``stop`` and ``join``, for a checkpointer used alone (not under a lock)."""
        self.join(self.stop())

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._stop = threading.Event()
            # Daemon: a process that forgets close() still exits; the WAL it leaves
            # holds every commit, and the next connection copies it.
            self._thread = threading.Thread(
                target=self._run,
                args=(self._stop,),
                name="reef-wal-checkpointer",
                daemon=True,
            )
            self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        own = OwnConnection(self._engine, RESTART_WAIT_MS)
        try:
            while True:
                self._wake.wait(self._interval)
                if stop.is_set():
                    return
                self._wake.clear()
                if self._uncopied == 0:
                    continue
                self._uncopied = 0
                self._pass(own, stop)
        finally:
            own.close()

    def _pass(self, own: OwnConnection, stop: threading.Event) -> None:
        try:
            connection = own.get()
            _busy, frames, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.passes += 1
            if frames < self._limit or copied < frames:
                return  # small enough, or a reader keeps older frames: no restart yet
            with self._hold:
                if stop.is_set():
                    return
                busy, _frames, _copied = connection.execute(
                    "PRAGMA wal_checkpoint(RESTART)"
                ).fetchone()
            if not busy:
                self.restarts += 1
        except sqlite3.Error as error:  # the file gone, disk full, ...: the next pass retries
            log.warning("WAL checkpoint failed: %s", error)
            own.close()
