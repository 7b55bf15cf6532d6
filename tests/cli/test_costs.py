"""``reef costs --since 7d``: the recorded exchanges' cost per scenario, key and purpose,
from the records' own costs (unpriced ones counted apart)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from reef.cli.main import app
from reef.experience import RecordDraft, open_store


def _draft(number: int, scenario: str, principal: str | None, **values: Any) -> RecordDraft:
    fields: dict[str, Any] = {
        "id": f"rec-{number}",
        "scenario": scenario,
        "session_id": f"sess-{number}",
        "api": "openai.chat",
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": None,
        "status": "ok",
        "error": None,
        "latency_ms": 1.0,
        "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        "release_id": None,
        "prompt_hash": f"p{number}",
        "content_hash": f"c{number}",
        "continuation_hash": None,
        "principal": principal,
    }
    fields.update(values)
    return RecordDraft(**fields)


def test_costs_sums_each_scenario_key_and_purpose_since_a_time(tmp_path: Path) -> None:
    home = tmp_path / ".reef"
    home.mkdir()
    config = tmp_path / "reef.yaml"
    config.write_text(f"home: {home}\n")
    store = open_store(f"sqlite:///{home / 'reef.db'}")
    long_ago = datetime.now(UTC) - timedelta(days=30)
    try:
        store.write_records(
            [
                _draft(1, "support", "ci", cost=0.5, release_id="rel-a"),
                _draft(2, "support", "ci", cost=0.25),
                _draft(3, "support", "ci", cost=None),  # unpriced
                _draft(4, "support", None, purpose="eval", cost=1.0),
                _draft(
                    5,
                    "claude",
                    "ci",
                    cost=2.0,
                    usage={"input_tokens": 4, "output_tokens": 2, "cache_read_input_tokens": 6},
                ),
                _draft(6, "support", "ci", cost=100.0, created_at=long_ago),  # before --since
            ]
        )
    finally:
        store.close()
    runner = CliRunner()
    result = runner.invoke(app, ["costs", "--since", "7d", "--config", str(config), "--json"])
    assert result.exit_code == 0, result.output
    rows = {(r["scenario"], r["key"], r["purpose"]): r for r in json.loads(result.output)}
    assert set(rows) == {
        ("support", "ci", "serve"),
        ("support", None, "eval"),
        ("claude", "ci", "serve"),
    }
    ci = rows[("support", "ci", "serve")]
    assert ci["requests"] == 3 and ci["unpriced"] == 1 and ci["cost"] == 0.75
    assert ci["input_tokens"] == 30 and ci["output_tokens"] == 15
    claude = rows[("claude", "ci", "serve")]
    assert (claude["input_tokens"], claude["cached_input_tokens"]) == (10, 6)
    table = runner.invoke(app, ["costs", "--config", str(config)])
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[1].split() == [
        "scenario",
        "key",
        "purpose",
        "requests",
        "unpriced",
        "input",
        "cached",
        "output",
        "cost",
    ]
    assert lines[2].split()[:3] == ["claude", "ci", "serve"]  # the costliest first
    assert lines[-1] == "total 3.7500 over 5 requests; 1 unpriced"
    releases = runner.invoke(app, ["costs", "--by", "release", "--config", str(config), "--json"])
    assert releases.exit_code == 0, releases.output
    per_release = {
        (r["scenario"], r["release"], r["purpose"]): r["cost"] for r in json.loads(releases.output)
    }
    assert per_release == {
        ("support", "rel-a", "serve"): 0.5,
        ("support", None, "serve"): 0.25,
        ("support", None, "eval"): 1.0,
        ("claude", None, "serve"): 2.0,
    }
