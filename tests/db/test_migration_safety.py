"""Before a SQLite store is upgraded it is copied beside itself; a revision that fails
(a statement, or a foreign key its rows break) rolls back and names the revision, the
statement, the store and the copy; a store a later Reef wrote is refused untouched."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from reef.db import MigrationFailedError, StoreNewerThanReefError
from reef.db.engine import create_store_engine
from reef.db.errors import BackupFailedError
from reef.db.migrations import (
    VERSION_TABLE,
    current_revision,
    head_revision,
    pending_revisions,
    upgrade,
)
from tests.db.revision_fixtures import ROWS, build_store
from tests.experience.conftest import ThrowawayDatabases


def _engine(path: Path) -> Engine:
    return create_store_engine(f"sqlite:///{path}")


def _dump(path: Path) -> list[str]:
    """Everything in the SQLite file at ``path``, schema and rows, as SQL."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def _revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return current_revision(conn)


def test_a_store_behind_head_is_copied_before_it_is_upgraded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "reef.db"
    engine = _engine(path)
    build_store(engine, "0005")
    before = _dump(path)
    with caplog.at_level(logging.INFO, logger="reef.db"):
        applied = upgrade(engine)
    engine.dispose()
    backup = tmp_path / "reef.db.before-0005"
    assert applied[0] == "0006" and applied[-1] == head_revision()
    assert _dump(backup) == before  # the store as it was, every row
    assert str(backup) in caplog.text
    assert [p.name for p in tmp_path.iterdir() if ".before-" in p.name] == [backup.name]


def test_a_new_store_and_a_store_at_head_are_not_copied(tmp_path: Path) -> None:
    engine = _engine(tmp_path / "reef.db")
    upgrade(engine)  # a brand-new file: nothing to keep
    assert upgrade(engine) == []  # at head: nothing to do
    engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir() if ".before-" in p.name) == []


def test_a_failing_statement_rolls_back_and_names_revision_statement_and_backup(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reef.db"
    engine = _engine(path)
    build_store(engine, "0005")
    with engine.begin() as conn:  # batch mode's own scratch table, in the way
        conn.execute(text("CREATE TABLE _alembic_tmp_feedback (x INTEGER)"))
    before = _dump(path)
    with pytest.raises(MigrationFailedError) as caught:
        upgrade(engine)
    backup = tmp_path / "reef.db.before-0005"
    message = caught.value.message
    assert caught.value.revision == "0006"
    assert "schema migration 0006 failed" in message
    assert "CREATE TABLE _alembic_tmp_feedback" in message
    assert f"{path} is unchanged" in message
    assert str(backup) in message and "reef migrate" in message
    assert f"copy {backup} over {path}" in message
    assert _revision(engine) == "0005"
    engine.dispose()
    assert _dump(path) == before
    assert _dump(backup) == before
    engine = _engine(path)
    assert pending_revisions(engine)[0] == "0006"  # a retry starts from it again
    engine.dispose()


def test_rows_that_break_a_foreign_key_abort_the_migration_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "reef.db"
    engine = _engine(path)
    build_store(engine, "0005")
    conn = sqlite3.connect(path)  # foreign keys off, as an old or hand-edited store had
    conn.execute("INSERT INTO feedback_refs VALUES ('fb-1', 'no-such-record', 9)")
    conn.commit()
    conn.close()
    before = _dump(path)
    with pytest.raises(MigrationFailedError) as caught:
        upgrade(engine)
    assert caught.value.revision == "0006"
    assert caught.value.statement == "PRAGMA foreign_key_check"
    assert "1 row(s) break a foreign key: feedback_refs rowid 4 (no row in records)" in (
        caught.value.message
    )
    assert _revision(engine) == "0005"
    with engine.connect() as check:  # the connection went back to the pool with them on
        assert check.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()
    assert _dump(path) == before
    assert len(ROWS["feedback_refs"]) == 3  # rowid 4 is the one added here


def test_a_store_from_a_later_reef_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "reef.db"
    engine = _engine(path)
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    engine = _engine(path)
    with pytest.raises(StoreNewerThanReefError) as caught:
        upgrade(engine)
    with pytest.raises(StoreNewerThanReefError):
        pending_revisions(engine)
    engine.dispose()
    assert caught.value.message == (
        f"the store is at schema revision 9999, newer than this Reef knows (its newest is "
        f"{head_revision()}): a later Reef wrote it. Run that Reef or a newer one; this one "
        "changed nothing in the store"
    )
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    assert not list(tmp_path.glob("*.before-*"))


def test_starters_on_one_store_behind_head_upgrade_it_once(tmp_path: Path) -> None:
    path = tmp_path / "reef.db"
    engine = _engine(path)
    build_store(engine, "0005")
    engine.dispose()
    engines = [_engine(path) for _ in range(4)]
    barrier = threading.Barrier(len(engines))
    applied: list[list[str]] = []
    errors: list[BaseException] = []

    def start(engine: Engine) -> None:
        barrier.wait()
        try:
            applied.append(upgrade(engine))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for engine in engines:
        engine.dispose()
    assert errors == []
    assert sorted(len(steps) > 0 for steps in applied) == [False, False, False, True]
    assert [p.name for p in tmp_path.glob("*.before-*")] == ["reef.db.before-0005"]


@pytest.mark.postgres
def test_postgresql_failure_and_newer_store_say_what_to_do(
    pg_databases: ThrowawayDatabases,
) -> None:
    engine = create_store_engine(pg_databases.create())
    build_store(engine, "0009")
    with engine.begin() as conn:  # in the way of 0010's CREATE TABLE
        conn.execute(text("CREATE TABLE eval_episodes (x INTEGER)"))
    with pytest.raises(MigrationFailedError) as caught:
        upgrade(engine)
    assert caught.value.revision == "0010"
    assert "CREATE TABLE eval_episodes" in caught.value.message
    assert "take a pg_dump of the database before you retry" in caught.value.message
    assert caught.value.backup is None
    assert _revision(engine) == "0009"

    with engine.begin() as conn:
        conn.execute(text("DROP TABLE eval_episodes"))
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(StoreNewerThanReefError):
        upgrade(engine)
    assert _revision(engine) == "9999"
    engine.dispose()


def test_a_backup_that_cannot_be_written_stops_the_upgrade_before_it_starts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reef.db"
    engine = _engine(path)
    build_store(engine, "0005")
    before = _dump(path)
    (tmp_path / "reef.db.before-0005.partial").mkdir()  # where the copy would be written
    with pytest.raises(BackupFailedError) as caught:
        upgrade(engine)
    assert caught.value.message.startswith(
        f"could not copy {path} to {tmp_path / 'reef.db.before-0005'} before upgrading it "
        "from schema revision 0005: "
    )
    assert _revision(engine) == "0005"
    engine.dispose()
    assert _dump(path) == before
