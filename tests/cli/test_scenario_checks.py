"""Commands that take ``--scenario`` refuse one that is neither configured nor in the
store (exit 2, naming the known ones), and ``reef learn`` refuses a scenario without a
recipe (exit 2, naming the setting) before it queues anything or creates a store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reef.db import open_database
from reef.experience import RecordDraft, open_store
from reef.jobs import JobQueue


def reef(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reef", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )


def _draft(scenario: str) -> RecordDraft:
    return RecordDraft(
        id=f"rec-{scenario}",
        scenario=scenario,
        session_id="sess",
        api="openai.chat",
        request={"messages": [{"role": "user", "content": "q"}]},
        response={"choices": [{"message": {"role": "assistant", "content": "a"}}]},
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        release_id=None,
        prompt_hash="p",
        content_hash="c",
        continuation_hash=None,
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A folder whose reef.yaml configures ``triage`` and whose store holds a record of
    ``support`` (a scenario created by traffic)."""
    (tmp_path / "reef.yaml").write_text("scenarios:\n  triage: {}\n")
    store = open_store(f"sqlite:///{tmp_path / '.reef' / 'reef.db'}")
    store.write_records([_draft("support")])
    store.close()
    return tmp_path


UNKNOWN = [
    ["releases", "list", "--scenario", "nope"],
    ["releases", "list", "--scenario", "nope", "--candidates"],
    ["releases", "rollback", "--scenario", "nope", "--to", "some-id"],
    ["export", "--scenario", "nope"],
    ["jobs", "list", "--scenario", "nope"],
    ["feedback", "calibrate", "--scenario", "nope"],
    ["eval", "run", "--scenario", "nope", "--candidate", "c", "--suite", "s.jsonl"],
    ["learn", "--scenario", "nope", "--recipe", "r.yaml"],
]


@pytest.mark.parametrize("args", UNKNOWN, ids=lambda args: " ".join(args))
def test_an_unknown_scenario_is_an_error_naming_the_known_ones(
    folder: Path, args: list[str]
) -> None:
    (folder / "r.yaml").write_text("learners: [{type: fewshot, k: 2}]\n")
    result = reef(*args, cwd=folder)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "unknown scenario 'nope'" in line, line
    assert "'support', 'triage'" in line, line  # configured and stored, sorted
    assert result.stdout == ""


def test_a_known_scenario_still_reads(folder: Path) -> None:
    stored = reef("export", "--scenario", "support", cwd=folder)
    assert stored.returncode == 0, stored.stderr
    assert "exported 1 records" in stored.stderr
    configured = reef("releases", "list", "--scenario", "triage", "--json", cwd=folder)
    assert configured.returncode == 0, configured.stderr
    assert configured.stdout.strip() == "[]"


def test_learn_without_a_recipe_is_refused_and_creates_no_store(tmp_path: Path) -> None:
    result = reef("learn", "--scenario", "support", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert "scenario 'support' has no recipe to learn with" in line, line
    assert "scenarios.support.recipe" in line and "--recipe" in line, line
    assert not (tmp_path / ".reef").exists()


def test_learn_without_a_recipe_queues_nothing_in_an_existing_store(folder: Path) -> None:
    result = reef("learn", "--scenario", "triage", cwd=folder)
    assert result.returncode == 2, result.stderr
    assert "scenarios.triage.recipe" in result.stderr
    database = open_database(f"sqlite:///{folder / '.reef' / 'reef.db'}")
    try:
        assert JobQueue(database).list() == []
    finally:
        database.close()


def test_learn_with_a_configured_recipe_queues_a_job(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text("learners: [{type: fewshot, k: 2}]\n")
    (tmp_path / "reef.yaml").write_text("scenarios:\n  triage: {recipe: r.yaml}\n")
    result = reef("learn", "--scenario", "triage", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    database = open_database(f"sqlite:///{tmp_path / '.reef' / 'reef.db'}")
    try:
        [job] = JobQueue(database).list()
    finally:
        database.close()
    assert job.id == result.stdout.strip() and job.scenario == "triage"
