"""``reef eval run`` against a real gateway: a report a person can read, and the
comparison stored like the gate's."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from reef.cli.main import app
from reef.evaluation.values import EvalItem, Provenance
from tests.evaluation.gate_setup import fact, quiz_world, write_suite


def test_eval_run_writes_a_report_and_stores_the_comparison(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "quiz.jsonl", range(25))
    with quiz_world(tmp_path) as world:
        base = world.publish_directly([fact(i) for i in range(5)])
        candidate = world.propose([fact(i) for i in range(25)])
        config = tmp_path / "reef.yaml"
        store_url = world.gateway.database.url
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
        store_url = world.gateway.database.url
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


def test_eval_show_prints_the_evidence_rule_and_screening(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "ops.jsonl", range(30, 42))
    with quiz_world(tmp_path) as world:
        world.publish_directly([])
        head = world.head()
        # A candidate that knows what one untrusted author's held-out items ask, and
        # nothing the operator's suite asks: the gain is the author's alone.
        candidate = world.chain.propose(
            "quiz",
            world.manifest([fact(i) for i in range(20)]),
            head.id,
            "test",
            "a test candidate",
            evidence={"selection": {"quarantined_new": 3, "screened:repeated_correction": 3}},
        )
        holdout = [
            EvalItem(
                id=f"h{i}",
                suite="holdout",
                messages=[{"role": "user", "content": f"Q: capital {i}"}],
                reference=f"answer-{i}",
                provenance=Provenance("holdout", "user", ("mallory",)),
            )
            for i in range(20)
        ]
        outcome = world.gate(holdout=True, suites=[str(suite)]).run(candidate.id, holdout)
        assert outcome.action == "rejected"
        assert world.head().id == head.id
        config = tmp_path / "reef.yaml"
        store_url = world.gateway.database.url
        config.write_text(f"home: {tmp_path / 'home'}\nstore: {{url: '{store_url}'}}\n")
        result = CliRunner().invoke(app, ["eval", "show", candidate.id, "-c", str(config)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"candidate {candidate.id}: rejected" in out
    assert "insufficient independent evidence: all 20 items below trust 'operator'" in out
    assert "evidence holdout (holdout): 20 items, user 20; authors mallory 20" in out
    assert "evidence file:ops (file): 12 items, operator 12" in out
    # without mallory the tie on 12 items decides nothing (the sequential rule waits)
    assert "without mallory (20 items): undecided, gain 0.000 on 12 items" in out
    # the evidence as it grew: one look
    assert ": rejected, 32 paired items (file:ops 12, holdout 20), 0 void, gain 0.625" in out
    assert "screening: quarantined_new 3, screened:repeated_correction 3" in out
