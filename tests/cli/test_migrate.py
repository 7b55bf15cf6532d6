"""``reef migrate`` (and ``--dry-run``), and what every command says on a store it cannot
use: one written by a later Reef (exit 5, nothing written) and one whose migration fails
(exit 6, naming the revision, the statement and the backup)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import text

from reef.db.engine import create_store_engine
from reef.db.migrations import VERSION_TABLE, head_revision, known_revisions, upgrade
from tests.db.revision_fixtures import build_store
from tests.gateway.harness import free_port

NO_MODEL = "upstreams:\n  u: {type: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n"


def reef(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "REEF_STORE__URL": f"sqlite:///{cwd / 'reef.db'}"},
    )


def _store_at(path: Path, revision: str) -> None:
    engine = create_store_engine(f"sqlite:///{path}")
    build_store(engine, revision)
    engine.dispose()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_dry_run_lists_the_pending_revisions_and_applies_none(tmp_path: Path) -> None:
    _store_at(tmp_path / "reef.db", "0005")
    digest = _digest(tmp_path / "reef.db")
    result = reef(tmp_path, "migrate", "--dry-run")
    assert result.returncode == 0, result.stderr
    pending = known_revisions()[known_revisions().index("0006") :]
    assert result.stdout.strip() == "would apply " + ", ".join(pending)
    assert _digest(tmp_path / "reef.db") == digest
    assert not list(tmp_path.glob("*.before-*"))

    result = reef(tmp_path, "migrate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        f"applied {', '.join(pending)}; store is at the latest schema ({head_revision()})"
    )
    assert (tmp_path / "reef.db.before-0005").exists()
    result = reef(tmp_path, "migrate", "--dry-run")
    assert result.stdout.strip().endswith("nothing to apply"), result.stdout


def test_dry_run_without_a_store_creates_none(tmp_path: Path) -> None:
    result = reef(tmp_path, "migrate", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"no store at {tmp_path / 'reef.db'}")
    assert not (tmp_path / "reef.db").exists()


def test_a_store_from_a_later_reef_is_refused_in_one_line_with_exit_5(tmp_path: Path) -> None:
    path = tmp_path / "reef.db"
    engine = create_store_engine(f"sqlite:///{path}")
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    engine.dispose()
    digest = _digest(path)
    (tmp_path / "reef.yaml").write_text(f"server: {{port: {free_port()}}}\n{NO_MODEL}")
    for args in (["migrate"], ["migrate", "--dry-run"], ["serve", "--no-worker"]):
        result = reef(tmp_path, *args)
        assert result.returncode == 5, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("error: the store is at schema revision 9999"), last
        assert f"its newest is {head_revision()}" in last and "newer one" in last, last
    assert _digest(path) == digest
    assert not list(tmp_path.glob("*.before-*"))


def test_a_failed_migration_exits_6_naming_revision_statement_and_backup(tmp_path: Path) -> None:
    path = tmp_path / "reef.db"
    _store_at(path, "0005")
    engine = create_store_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE _alembic_tmp_feedback (x INTEGER)"))
    engine.dispose()
    result = reef(tmp_path, "migrate")
    assert result.returncode == 6, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "schema migration 0006 failed" in last, last
    assert "CREATE TABLE _alembic_tmp_feedback" in last, last
    assert str(tmp_path / "reef.db.before-0005") in last, last
