"""``bench/distill.py --quick`` end to end on tiny-random: the teacher's answers are
recorded, ``distill`` trains the student on them, and the distilled arm answers from the
student on the application's short prompt (no teacher call, far fewer prompt tokens)
while the teacher-only arm pays for the few-shot harness on every request. The figures
of a SmolLM2 run are in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")


def test_quick_run_reports_both_arms(tmp_path: Path) -> None:
    report_path, section = tmp_path / "report.json", tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "distill.py"), "--quick", "--threads", "1",
            "--json", str(report_path), "--output", str(section),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    teacher, distilled = report["teacher_only"], report["distilled"]
    assert teacher["teacher_share"] == 1.0 and distilled["teacher_share"] == 0.0
    # The student serves the application's own prompt, without the few-shot harness.
    assert distilled["prompt_tokens_per_request"] < teacher["prompt_tokens_per_request"] / 2
    assert 0.0 <= distilled["accuracy"] <= 1.0
    assert report["training"]["examples"] == report["train"] == 8
    assert report["training"]["steps"] == 2
    assert report["adapter"].startswith("sha256:")
    text = section.read_text()
    assert "<!-- distill:start -->" in text and "| distilled student |" in text


def test_routing_by_share_is_repeatable() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import distill

    from reef.quickstart.scenario import TicketGenerator

    tickets = TicketGenerator(seed=1).draw(60, held_out=True)
    assert not any(distill.routed_to_student(t, 0.0) for t in tickets)
    assert all(distill.routed_to_student(t, 1.0) for t in tickets)
    half = [distill.routed_to_student(t, 0.5) for t in tickets]
    assert half == [distill.routed_to_student(t, 0.5) for t in tickets]
    assert 10 < sum(half) < 50
