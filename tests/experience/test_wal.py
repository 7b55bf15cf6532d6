"""The record writer's WAL checkpoints, off the writing thread (``reef.experience.sql.wal``),
on real SQLite files: the writer's own commits copy nothing into the database, the
checkpointer thread keeps the WAL bounded, closing stops it, writers on one file
checkpoint side by side, and records committed before a SIGKILL are all there."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from reef.db.engine import create_store_engine
from reef.experience import RecordDraft, SQLExperienceStore
from reef.experience.sql.sqlite_records import SQLiteRecordWriter
from reef.experience.sql.wal import WalCheckpointer
from tests.experience.conftest import DraftFactory
from tests.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
PAGE = 4096
NEVER = 10**9  # records: no pass is ever due by count


def wal_frames(db: Path) -> int:
    """Frames the WAL file has room for (its size; a restarted WAL reuses the file)."""
    wal = Path(f"{db}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    return max(0, size - 32) // (PAGE + 24)


def stored_ids(db: Path) -> set[str]:
    connection = sqlite3.connect(db)
    try:
        return {row[0] for row in connection.execute("SELECT id FROM records")}
    finally:
        connection.close()


def commit(writer: SQLiteRecordWriter, draft: RecordDraft, now: bool) -> None:
    """Write ``draft`` as the event loop does (``now``: without waiting, and when that
    finds the writer busy, as its writer thread does) or as the writer thread does."""
    if now and writer.write([draft], set(), wait=False) is not None:
        return
    assert writer.write([draft], set()) == [draft.id]


def checkpointer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "reef-wal-checkpointer"]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "reef.db"
    store = SQLExperienceStore.from_url(f"sqlite:///{path}")
    store.migrate()
    store.close()
    return path


@pytest.fixture
def engine(db: Path) -> Iterator[Engine]:
    engine = create_store_engine(f"sqlite:///{db}")
    yield engine
    engine.dispose()


def test_the_writer_commits_never_checkpoint(
    db: Path, engine: Engine, make_draft: DraftFactory
) -> None:
    # With no pass due, the database file gets nothing however long the WAL grows:
    # SQLite's autocheckpoint (1000 pages, 4000 as Reef set it before) is off.
    writer = SQLiteRecordWriter(
        engine, checkpoint_every_records=NEVER, checkpoint_interval_seconds=3600
    )
    size_before = db.stat().st_size
    try:
        for number in range(800):
            # Both connections: the one that waits and the event loop's, which never does.
            assert writer.write([make_draft()], set(), wait=number % 2 == 0) is not None
        assert wal_frames(db) > 4000, "too few frames to have met an autocheckpoint"
        assert db.stat().st_size == size_before
        assert writer.checkpointer.passes == 0
    finally:
        writer.close()
    assert len(stored_ids(db)) == 800


def test_the_checkpointer_keeps_the_wal_bounded(
    db: Path, engine: Engine, make_draft: DraftFactory
) -> None:
    # Without it the 1500 one-record commits below leave ~15000 frames in the WAL.
    writer = SQLiteRecordWriter(
        engine, checkpoint_every_records=50, checkpoint_interval_seconds=3600, wal_limit_pages=500
    )
    largest = 0
    try:
        for _ in range(30):
            passes = writer.checkpointer.passes
            for number in range(50):
                commit(writer, make_draft(), now=number % 2 == 0)
            eventually(lambda at=passes: writer.checkpointer.passes > at, "a checkpoint pass")
            largest = max(largest, wal_frames(db))
        assert largest < 3000, f"the WAL grew to {largest} frames"
    finally:
        writer.close()
    assert len(stored_ids(db)) == 1500


def test_a_wal_past_the_limit_is_restarted(
    db: Path, engine: Engine, make_draft: DraftFactory
) -> None:
    # One pass after 600 commits: its PASSIVE copies every frame, the WAL is past the
    # limit, so it restarts the WAL, and the next commit writes from its start.
    writer = SQLiteRecordWriter(
        engine, checkpoint_every_records=600, checkpoint_interval_seconds=3600, wal_limit_pages=500
    )
    try:
        for _ in range(600):
            commit(writer, make_draft(), now=True)
        eventually(lambda: writer.checkpointer.restarts == 1, "a WAL restart")
        writer.write([make_draft()], set())
        probe = sqlite3.connect(db)
        try:
            _busy, frames, _copied = probe.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            probe.close()
        assert 0 < frames < 100  # the last commit's frames only, not the 600 before it
    finally:
        writer.close()
    assert len(stored_ids(db)) == 601


def test_closing_the_writer_stops_its_checkpointer(
    engine: Engine, make_draft: DraftFactory
) -> None:
    writer = SQLiteRecordWriter(engine)
    assert checkpointer_threads() == []  # started by the first commit, not before
    writer.write([make_draft()], set())
    assert writer.checkpointer.running
    assert len(checkpointer_threads()) == 1
    writer.close()
    assert not writer.checkpointer.running
    assert checkpointer_threads() == []
    writer.write([make_draft()], set())  # a write after close starts another
    assert len(checkpointer_threads()) == 1
    writer.close()
    assert checkpointer_threads() == []


def test_a_commit_while_the_checkpointer_stops_starts_another(engine: Engine) -> None:
    checkpointer = WalCheckpointer(engine, hold=threading.Lock())
    checkpointer.committed(1)
    stopping = checkpointer.stop()
    checkpointer.committed(1)  # between stop and join, as a write racing a close
    checkpointer.join(stopping)
    assert stopping is not None and not stopping.is_alive()
    assert checkpointer.running
    checkpointer.close()
    assert not checkpointer.running
    assert checkpointer_threads() == []


def test_writers_on_one_file_checkpoint_side_by_side(
    db: Path, make_draft: DraftFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # As gateway processes on one file do (``reef serve --workers``): each has its own
    # checkpointer; one checkpoints while the other's waits or finds nothing to copy.
    engines = [create_store_engine(f"sqlite:///{db}") for _ in range(2)]
    writers = [
        SQLiteRecordWriter(
            e, checkpoint_every_records=5, checkpoint_interval_seconds=3600, wal_limit_pages=200
        )
        for e in engines
    ]
    written: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def write(index: int) -> None:
        try:
            for _ in range(300):
                ids = writers[index].write([make_draft()], set())
                assert ids is not None
                written[index] += ids
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="reef.experience.sql.wal"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        passes = [w.checkpointer.passes for w in writers]
        for writer, e in zip(writers, engines, strict=True):
            writer.close()
            e.dispose()
    assert errors == []
    assert all(count > 0 for count in passes), passes
    assert caplog.records == []
    assert stored_ids(db) == set(written[0]) | set(written[1])
    assert len(stored_ids(db)) == 600


_WRITE_UNTIL_KILLED = textwrap.dedent(
    """
    import sys
    from reef.db.engine import create_store_engine
    from reef.experience import RecordDraft
    from reef.experience.sql.sqlite_records import SQLiteRecordWriter

    writer = SQLiteRecordWriter(
        create_store_engine(sys.argv[1]),
        checkpoint_every_records=5,
        checkpoint_interval_seconds=3600,
        wal_limit_pages=100,
    )
    number = 0
    while True:
        number += 1
        draft = RecordDraft(
            id=f"rec-{number}", scenario="support", session_id="s", api="openai.chat",
            request={"messages": []}, response={"choices": []}, status="ok", error=None,
            latency_ms=1.0, usage=None, release_id=None, prompt_hash="p", content_hash="c",
            continuation_hash=None,
        )
        if writer.write([draft], set(), wait=number % 2 == 0) is None:  # busy: not written
            writer.write([draft], set())
        print(draft.id, writer.checkpointer.restarts, flush=True)  # acknowledged: committed
    """
)


def test_records_committed_before_a_sigkill_are_all_there(db: Path) -> None:
    # The process restarts its WAL every ~10 records, so the kill lands amid checkpoints.
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen(
        [sys.executable, "-c", _WRITE_UNTIL_KILLED, f"sqlite:///{db}"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert process.stdout is not None
    acknowledged = []
    restarts = 0
    try:
        for line in process.stdout:
            record_id, restarts_so_far = line.split()
            acknowledged.append(record_id)
            restarts = int(restarts_so_far)
            if len(acknowledged) == 600:
                break
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
    assert len(acknowledged) == 600
    assert restarts > 0  # the WAL was being restarted while it wrote
    assert set(acknowledged) <= stored_ids(db)
