"""Commands that read a store never create one: where there is none they say so (where
they looked, which setting picks one) and exit 3, leaving no ./.reef behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from reef.experience import open_store
from tests.experience.conftest import PG_ENV, ThrowawayDatabases


def reef(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


READERS = [
    ["releases", "list"],
    ["releases", "list", "--scenario", "s"],
    ["releases", "show", "some-id"],
    ["releases", "rollback", "--scenario", "s", "--to", "some-id"],
    ["releases", "promote", "some-candidate"],
    ["jobs", "list"],
    ["jobs", "show", "some-job"],
    ["jobs", "cancel", "some-job"],
    ["export", "--scenario", "s"],
    ["gc"],
    ["feedback", "calibrate", "--scenario", "s"],
    ["signals", "preview", "--scenario", "s"],
    ["eval", "run", "--scenario", "s", "--candidate", "c", "--suite", "suite.jsonl"],
]


@pytest.mark.parametrize("args", READERS, ids=lambda args: " ".join(args))
def test_a_reader_in_an_empty_directory_says_there_is_no_store(
    tmp_path: Path, args: list[str]
) -> None:
    result = reef(*args, cwd=tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "no Reef store" in line, line
    assert str(tmp_path / ".reef" / "reef.db") in line, line
    assert "--config" in line and "store.url" in line, line
    assert not (tmp_path / ".reef").exists()


def test_the_message_names_the_store_the_config_points_at(tmp_path: Path) -> None:
    (tmp_path / "reef.yaml").write_text(f"home: {tmp_path / 'elsewhere'}\n")
    result = reef("releases", "list", cwd=tmp_path)
    assert result.returncode == 3
    assert str(tmp_path / "elsewhere" / "reef.db") in result.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_a_reader_reads_an_existing_store(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / '.reef' / 'reef.db'}").close()
    result = reef("releases", "list", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    listed = reef("jobs", "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr


def test_status_creates_no_store(tmp_path: Path) -> None:
    result = reef("status", "--url", "http://127.0.0.1:9", cwd=tmp_path)
    assert result.returncode == 1
    assert "no gateway at http://127.0.0.1:9" in result.stderr
    assert not (tmp_path / ".reef").exists()


@pytest.mark.postgres
def test_a_postgres_database_without_reef_tables_is_no_store(tmp_path: Path) -> None:
    admin_url = os.environ.get(PG_ENV)
    if not admin_url:
        pytest.skip(f"{PG_ENV} is not set; PostgreSQL store tests need a server")
    databases = ThrowawayDatabases(admin_url)
    try:
        url = databases.create()
        result = reef("jobs", "list", cwd=tmp_path, env={"REEF_STORE__URL": url})
        assert result.returncode == 3, result.stderr
        assert "no Reef store in" in result.stderr and "no Reef tables" in result.stderr
        engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        try:
            assert inspect(engine).get_table_names() == []
        finally:
            engine.dispose()
        open_store(url).close()
        listed = reef("jobs", "list", "--json", cwd=tmp_path, env={"REEF_STORE__URL": url})
        assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
    finally:
        databases.drop_all()
