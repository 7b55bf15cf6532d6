"""``reef eval run`` against a real gateway: a report a person can read, and the
comparison stored like the gate's."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from reef.cli.main import app
from tests.evaluation.gate_setup import fact, quiz_world, write_suite


def test_eval_run_writes_a_report_and_stores_the_comparison(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "quiz.jsonl", range(25))
    with quiz_world(tmp_path) as world:
        base = world.publish_directly([fact(i) for i in range(5)])
        candidate = world.propose([fact(i) for i in range(25)])
        config = tmp_path / "reef.yaml"
        store_url = world.gateway.store.engine.url.render_as_string(hide_password=False)
        config.write_text(f"home: {tmp_path / 'home'}\nstore: {{url: '{store_url}'}}\n")
        out = tmp_path / "report"
        result = CliRunner().invoke(
            app,
            [
                "eval", "run", "--scenario", "quiz", "--candidate", candidate.id,
                "--suite", str(suite), "--gateway", world.gateway.url,
                "--out", str(out), "--min-items", "10", "-c", str(config),
            ],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "passed:" in result.output
        report = json.loads((out / "report.json").read_text())
        assert report["decision"]["verdict"] == "passed"
        assert report["meta"]["baseline"] == base.id  # --against defaults to the head
        assert len(report["items"]) == 25
        assert (out / "differences.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "## Verdict: **PASSED**" in (out / "report.md").read_text()
        [stored] = world.evaluations.list("quiz")
        assert stored.candidate_id == candidate.id and stored.verdict == "passed"
        assert world.head().id == base.id, "a manual evaluation publishes nothing"


def test_eval_run_names_an_unknown_candidate(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "quiz.jsonl", range(3))
    with quiz_world(tmp_path) as world:
        config = tmp_path / "reef.yaml"
        store_url = world.gateway.store.engine.url.render_as_string(hide_password=False)
        config.write_text(f"home: {tmp_path / 'home'}\nstore: {{url: '{store_url}'}}\n")
        result = CliRunner().invoke(
            app,
            [
                "eval", "run", "--scenario", "quiz", "--candidate", "no-such-candidate",
                "--suite", str(suite), "--gateway", world.gateway.url, "-c", str(config),
            ],
        )  # fmt: skip
        assert result.exit_code != 0
        assert "no-such-candidate" in str(result.exception or result.output)


def test_serve_gives_its_own_worker_a_gate_key_only_in_memory(tmp_path: Path) -> None:
    from reef.cli.serving import with_gate_key
    from reef.config import ReefSettings

    open_settings = ReefSettings(home=tmp_path)
    assert with_gate_key(open_settings) is open_settings  # no keys: nothing to add
    keyed = ReefSettings(home=tmp_path, auth={"keys": [{"id": "app", "key": "k1"}]})
    settings = with_gate_key(keyed)
    assert settings.evaluation.api_key is not None
    secret = settings.evaluation.api_key.get_secret_value()
    [gate_key] = [key for key in settings.auth.keys if key.id == "reef-gate"]
    assert gate_key.role == "admin" and gate_key.key is None  # only its hash is held
    import hashlib

    assert gate_key.sha256 == hashlib.sha256(secret.encode()).hexdigest()
    assert with_gate_key(keyed).evaluation.api_key != settings.evaluation.api_key
