"""``reef quickstart --task distill`` in its reduced mode (the tiny random model): the
teacher on loopback answers the first release's traffic, which has no feedback at all;
one ``distill`` job trains and the gate decides; the held-out figures of both times are
reported. Accuracy after distillation is the full run's business (the tiny model learns
six labels from 24 tickets no better than chance)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reef.cli.main import app
from reef.experience import open_store
from tests.engine.lora_factory import PEFT_WRAP_WARNING

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REQUESTS, HELDOUT = 24, 12


@pytest.mark.slow
@pytest.mark.filterwarnings(PEFT_WRAP_WARNING)
def test_reduced_distill_quickstart_reports_teacher_only_and_distilled(tmp_path: Path) -> None:
    root = tmp_path / "qs"
    args = ["quickstart", "--task", "distill", "--model", "tiny-random", "--dir", str(root)]
    args += ["--requests", str(REQUESTS), "--heldout", str(HELDOUT), "--port", "0"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert "teacher only" in result.output and "distilled" in result.output

    summary = json.loads((root / "summary.json").read_text())
    teacher_only = summary["teacher_only"]
    # the first release routes everything to the teacher, which labels every ticket right
    assert teacher_only["teacher_share"] == 1.0 and teacher_only["accuracy"] == 1.0
    assert teacher_only["total"] == HELDOUT
    assert teacher_only["prompt_tokens_per_request"] > 0, "the teacher counts its prompt"
    assert summary["gate_action"] in ("canary", "rejected", "undecided"), summary["gate"]
    assert summary["gate"]["decision"], "the gate says why"
    assert summary["distilled"]["total"] == HELDOUT

    recipe = (root / "recipe.yaml").read_text()
    assert "type: distill" in recipe and "non_inferiority_margin" in recipe
    store = open_store(f"sqlite:///{root / '.reef' / 'reef.db'}")
    try:
        records = list(store.iter_export("triage"))
    finally:
        store.close()
    traffic = [
        r for r in records if r.purpose == "serve" and r.release_id == teacher_only["release_id"]
    ]
    assert len(traffic) == REQUESTS
    assert all(r.tags.get("reef.served_by") == "teacher" for r in traffic)
    assert not any(r.feedback for r in traffic), "the distilled traffic has no feedback"
    evals = [r for r in records if r.purpose == "eval"]
    assert len(evals) >= 2 * HELDOUT, "the held-out questions are eval records"


def test_the_distill_task_refuses_implicit_feedback(tmp_path: Path) -> None:
    args = ["quickstart", "--task", "distill", "--feedback", "implicit", "--dir", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "--task distill" in str(result.exception)
    assert not list(tmp_path.iterdir())
