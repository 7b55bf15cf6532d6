"""``reef releases`` commands (typer's runner on ``releases_app`` until the lead mounts it
under ``reef``; then ``python -m reef releases ...`` runs the same code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from reef.cli.releases import cli_actor, releases_app
from reef.core.errors import NotFoundError
from reef.releases import Release, ReleaseChain, ReleaseConflictError
from tests.releases.conftest import ManifestFactory


@pytest.fixture
def config(store_url: str, tmp_path: Path) -> Path:
    path = tmp_path / "reef.yaml"
    path.write_text(f"store:\n  url: '{store_url}'\n", encoding="utf-8")
    return path


@pytest.fixture
def history(chain: ReleaseChain, manifest: ManifestFactory) -> list[Release]:
    root = chain.create("s", manifest(harness=1), "config", "init")
    candidate = chain.propose("s", manifest(adapter=2), root.id, "worker", "job")
    learned = chain.publish(candidate.id, root.id, "worker", "gate", require_passed=False)
    return [root, learned]


def run(config: Path, *args: str) -> Any:
    result = CliRunner().invoke(releases_app, [*args, "-c", str(config)], catch_exceptions=True)
    return result


def run_json(config: Path, *args: str) -> Any:
    result = run(config, *args, "--json")
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.output)


def test_list_scenarios_releases_and_candidates(config: Path, history: list[Release]) -> None:
    root, learned = history
    [summary] = run_json(config, "list")
    assert summary == {"name": "s", "head_release_id": learned.id, "head_seq": 2, "releases": 2}
    listed = run_json(config, "list", "--scenario", "s")
    assert [r["id"] for r in listed] == [learned.id, root.id]
    assert listed[0]["manifest"]["parent"] == root.id
    [candidate] = run_json(config, "list", "--scenario", "s", "--candidates")
    assert candidate["state"] == "published"
    table = run(config, "list", "--scenario", "s")
    assert table.exit_code == 0 and learned.id in table.output and "learn" in table.output


def test_show_release_and_candidate(config: Path, history: list[Release]) -> None:
    _, learned = history
    shown = run_json(config, "show", learned.id)
    assert shown["kind"] == "release" and shown["created_by"] == "worker"
    assert shown["manifest"]["operation"] == "learn"
    assert learned.candidate_id is not None
    assert run_json(config, "show", learned.candidate_id)["kind"] == "candidate"
    table = run(config, "show", learned.id)
    assert table.exit_code == 0 and "worker" in table.output
    missing = run(config, "show", "nope")
    assert isinstance(missing.exception, NotFoundError)


def test_rollback_defaults_to_the_current_head(
    config: Path, chain: ReleaseChain, history: list[Release]
) -> None:
    root, learned = history
    back = run_json(config, "rollback", "--scenario", "s", "--to", root.id, "--reason", "bad")
    assert (back["operation"], back["parent_id"], back["reason"]) == ("rollback", learned.id, "bad")
    assert back["created_by"] == cli_actor() and cli_actor().startswith("cli:")
    head = chain.head("s")
    assert head is not None and head.id == back["id"]
    stale = run(config, "rollback", "--scenario", "s", "--to", root.id, "--expected-head", root.id)
    assert isinstance(stale.exception, ReleaseConflictError)


def test_promote_a_passed_candidate(
    config: Path, chain: ReleaseChain, manifest: ManifestFactory, history: list[Release]
) -> None:
    _, learned = history
    candidate = chain.propose("s", manifest(adapter=3), learned.id, "worker", "review mode")
    chain.set_candidate_state(candidate.id, "evaluating")
    chain.set_candidate_state(candidate.id, "passed", {"win_rate": 0.9})
    promoted = run_json(config, "promote", candidate.id, "--reason", "looks good")
    assert (promoted["operation"], promoted["evidence"]) == ("promote", {"win_rate": 0.9})
    assert chain.get_candidate(candidate.id).state == "published"


def test_reef_releases_as_a_user_runs_it(config: Path, history: list[Release]) -> None:
    _, learned = history
    result = subprocess.run(
        [sys.executable, "-m", "reef", "releases", "show", learned.id, "--json", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "No such command 'releases'" in result.stderr:
        pytest.skip("reef.cli.main does not mount releases_app yet")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["id"] == learned.id
    missing = subprocess.run(
        [sys.executable, "-m", "reef", "releases", "show", "nope", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 3 and "not found" in missing.stderr
