"""Protected slices (``gate.protect``): a candidate may not regress a tagged slice beyond
its limit, whatever its overall gain; each slice is reported in the decision. A real
gateway in front of the oracle upstream, a file suite whose items carry tags."""

from __future__ import annotations

import json
from pathlib import Path

from reef.evaluation.decision import tag_matches
from tests.evaluation.gate_setup import fact, quiz_world


def write_tagged_suite(path: Path) -> None:
    """Forty quiz items: q0..q9 tagged ``vip``, the rest ``general``."""
    lines = [
        json.dumps(
            {
                "id": f"q{i}",
                "input": f"Q: capital {i}",
                "reference": f"answer-{i}",
                "tags": ["vip" if i < 10 else "general"],
            }
        )
        for i in range(40)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_a_protected_slice_regression_rejects_a_candidate_with_an_overall_gain(
    tmp_path: Path,
) -> None:
    write_tagged_suite(tmp_path / "quiz.jsonl")
    vip = [fact(i) for i in range(10)]
    general = [fact(i) for i in range(10, 40)]
    protect = [{"tag": "vip", "max_regression": 0.1}]
    with quiz_world(tmp_path) as world:
        base = world.publish_directly(vip)
        # Right on the 30 general items, wrong on the 10 vip ones: +0.5 overall.
        candidate = world.propose(general)
        outcome = world.gate(suites=["quiz.jsonl"], protect=protect).run(candidate.id)

        decision = outcome.decision
        assert outcome.action == "rejected" and decision is not None
        assert decision.overall is not None and decision.overall.difference.mean == 0.5
        assert decision.reasons == [
            "protected slice vip dropped 1.000 (baseline 1.000, candidate 0.000, 10 items), "
            "more than its max_regression 0.100"
        ]
        [row] = decision.slices
        assert (row["tag"], row["items"], row["status"], row["change"]) == (
            "vip", 10, "regressed", -1.0,
        )  # fmt: skip
        assert world.head().id == base.id

        # Keeping the vip slice, the same gain passes, and the slice is reported.
        keeps = world.propose([*vip, *general])
        passed = world.gate(suites=["quiz.jsonl"], protect=protect).run(keeps.id)
        assert passed.action == "published" and passed.decision is not None
        assert passed.decision.slices[0]["status"] == "ok"
        assert passed.decision.slices[0]["change"] == 0.0


def test_a_slice_tag_matches_suite_tags_and_record_tags() -> None:
    assert tag_matches("vip", ("vip",))
    assert tag_matches("tier", ("tier=gold",))  # a record's x-reef-tag-tier: gold
    assert tag_matches("tier=gold", ("tier=gold",))
    assert not tag_matches("tier=gold", ("tier=silver",))
    assert not tag_matches("vip", ("vipx", "general"))
