"""The shadow panel of the candidate page, in headless Chromium, on a decision whose
judge was flagged for position bias: its counts, the suite per provenance, and why the
judged pairs did not count (``gate.js`` ``shadowBlock``; the report is the one
``reef.evaluation.shadow.shadow_results`` writes, and ``tests/e2e/test_shadow_loop.py``
shows a real one)."""

from __future__ import annotations

from typing import Any

from tests.dashboard.browser import DashboardPage
from tests.dashboard.world import ADMIN_KEY, DashboardWorld

FLAG = "shadow judge 'judge-1' flagged for position bias: 3 of 3 pairs flipped"


def _summary(suite: str, items: int, candidate: float, baseline: float) -> dict[str, Any]:
    gain = candidate - baseline
    return {
        "suite": suite,
        "items": items,
        "candidate_mean": candidate,
        "baseline_mean": baseline,
        "difference": {"mean": gain, "low": gain - 0.2, "high": gain + 0.1, "confidence": 0.95},
    }


def test_the_shadow_panel_shows_provenance_and_a_flagged_judge(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    report = {
        "pairs": 9,
        "live": 5,
        "judged": 3,
        "void": 1,
        "unscored": 0,
        "references": 5,
        "summaries": {
            "all": _summary("shadow", 5, 0.8, 0.4),
            "live": _summary("shadow:live", 5, 0.8, 0.4),
        },
        "judge": {"upstream": "judge", "model": "judge-1", "checked": 3, "flips": 3,
                  "flip_share": 1.0, "max_share": 0.2, "flagged": True, "reason": FLAG},
    }  # fmt: skip
    overall = _summary("overall", 5, 0.8, 0.4)
    decision = {
        "verdict": "undecided",
        "reasons": [FLAG],
        "rule": {},
        "overall": overall,
        "suites": [report["summaries"]["all"]],
        "evidence": {"shadow": report},
    }
    made = world.chain.propose("shadow-proof", world.manifest([]), None, "test", "shadowed")
    world.chain.set_candidate_state(made.id, "evaluating", {"gate": {"decision": decision}})

    tab.open("#/", "auth")
    tab.sign_in(ADMIN_KEY)
    tab.wait("#/")
    tab.open(f"#/candidates/{made.id}")
    counts = ("pairs", "live", "judged", "void", "unscored")
    shown = [tab.text(f'#shadow-counts [data-count="{name}"]') for name in counts]
    assert shown == ["9", "5", "3", "1", "0"]
    # No judged row: a flagged judge's verdicts do not count.
    assert tab.texts("#shadow table tbody tr td:first-child") == ["all", "live"]
    judge = tab.text("#shadow-judge")
    assert "judge flagged" in judge and "3 pairs judged in both orders, 3 flipped (100%)" in judge
    assert FLAG in judge
    assert tab.problems == []
