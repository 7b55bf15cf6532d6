"""A decided canary's provenance on the candidate page, in headless Chromium: the canary
monitor stores it in ``evidence.canary.evidence`` with the gate's structure (built here
by the gate's own ``check_independence``), and the page shows its sources by arm, trust
and author and the leave-one-author-out check that stopped the promotion."""

from __future__ import annotations

from reef.evaluation.provenance import LeftOut, check_independence
from reef.evaluation.values import Provenance
from tests.dashboard.browser import DashboardPage
from tests.dashboard.world import ADMIN_KEY, DashboardWorld

REASON = "not promoted: insufficient independent evidence (test)"


def test_an_abandoned_canary_shows_where_its_live_feedback_came_from(
    tab: DashboardPage, world: DashboardWorld
) -> None:
    origin = {f"c{n}": Provenance("live", "untrusted", ("crowd",)) for n in range(21)}
    origin |= {f"h{n}": Provenance("live", "operator", ("ops",)) for n in range(20)}
    arms = {key: "canary" if key.startswith("c") else "head" for key in origin}

    def without(removed: frozenset[str]) -> LeftOut:
        reason = "insufficient evidence: 0 canary and 20 head records with feedback"
        return LeftOut(False, "rejected", len(origin) - len(removed), None, None, [reason])

    found = check_independence(origin, arms, True, "operator", without, unit="records")
    assert not found.passed and found.reason is not None
    canary = {"fraction": 0.5, "decision": "abandoned", "reason": REASON, "live": {}}
    evidence = {"canary": {**canary, "evidence": found.evidence}}
    chain = world.chain
    made = chain.propose("canary-proof", world.manifest([]), None, "test", "a canary")
    chain.set_candidate_state(made.id, "abandoned", evidence)

    tab.open("#/", "auth")
    tab.sign_in(ADMIN_KEY)
    tab.wait("#/")
    tab.open(f"#/candidates/{made.id}")
    assert REASON in tab.text("#canary-decision")
    shown = tab.text("#canary-evidence")
    assert "Canary evidence provenance" in shown and "crowd" in shown
    assert tab.text("#canary-evidence #items-below") == "21"
    assert "untrusted" in tab.text("#canary-evidence #sources")
    checks = tab.text("#canary-evidence #leave-one-out")
    assert "crowd" in checks and "0 canary and 20 head" in checks
