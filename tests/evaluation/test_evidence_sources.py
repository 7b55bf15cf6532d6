"""Outside evidence (``Gate.sources``): paired results gathered elsewhere — shadow answers
on live traffic — join the gate's own as a current suite, stored with the evaluation
and weighed by ``gate.evidence_weights``. A real gateway in front of the oracle."""

from __future__ import annotations

from pathlib import Path

from reef.evaluation.values import ARMS, EvalItem, ItemResult, Provenance
from tests.evaluation.gate_setup import fact, quiz_world, write_suite

ALL = [fact(i) for i in range(20)]


class ShadowResults:
    """Thirty live requests the candidate answered right and the head did not."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def paired(
        self, candidate_id: str, baseline_id: str
    ) -> tuple[list[EvalItem], list[ItemResult]]:
        self.asked.append((candidate_id, baseline_id))
        items = [
            EvalItem(id=f"live{i}", suite="shadow", messages=[], provenance=Provenance("live"))
            for i in range(30)
        ]
        results = [
            ItemResult(item.key, item.suite, arm, 0, float(arm == "candidate"), None, None, None)
            for item in items
            for arm in ARMS
        ]
        return items, results


def test_shadow_results_join_the_evidence_as_their_weight_says(tmp_path: Path) -> None:
    write_suite(tmp_path / "quiz.jsonl", range(20))
    with quiz_world(tmp_path) as world:
        base = world.publish_directly(ALL)
        # Equal to the head on the suite: only the shadow results can show a gain.
        ignored = world.gate(suites=["quiz.jsonl"], evidence_weights={"shadow": 0.0})
        ignored.sources = [ShadowResults()]
        tie = ignored.run(world.propose(ALL).id)
        assert tie.decision is not None and not tie.decision.passed
        assert tie.decision.overall is not None and tie.decision.overall.items == 20

        source = ShadowResults()
        gate = world.gate(suites=["quiz.jsonl"])
        gate.sources = [source]
        candidate = world.propose(ALL)
        outcome = gate.run(candidate.id)
        assert outcome.action == "published", outcome.decision
        assert source.asked == [(candidate.id, base.id)]
        decision = outcome.decision
        assert decision is not None and decision.overall is not None
        assert decision.overall.items == 50
        assert decision.voids["suites"] == {"file:quiz": 20, "shadow": 30}
        [shadow] = [row for row in decision.evidence["sources"] if row["suite"] == "shadow"]
        assert shadow["source"] == "live"
        stored = world.evaluations.items(outcome.evaluation_id or "")
        assert sum(item.suite == "shadow" for item in stored) == 30
