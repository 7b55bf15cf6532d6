"""The independence rule: evidence below ``evidence_min_trust`` counts only when no single
author decides the outcome (leave-one-author-out)."""

from __future__ import annotations

from reef.core import Trust
from reef.evaluation.config import GateRule
from reef.evaluation.decision import decide_results
from reef.evaluation.values import Arm, EvalItem, ItemResult, Provenance

# The leave-one-author-out rule, shown on the one-look bootstrap rule.
RULE = GateRule(min_items=10, bootstrap_samples=300, method="bootstrap")


def items(
    suite: str,
    count: int,
    authors: list[str] | None = None,
    trust: Trust = "user",
) -> list[EvalItem]:
    """``count`` items of ``suite``; holdout items cycle through ``authors``."""
    made = []
    for index in range(count):
        provenance = (
            Provenance("holdout", trust, (authors[index % len(authors)],))
            if authors
            else Provenance("file")
        )
        made.append(
            EvalItem(
                id=f"i{index}",
                suite=suite,
                messages=[{"role": "user", "content": f"q{index}"}],
                reference="a",
                provenance=provenance,
            )
        )
    return made


def results(asked: list[EvalItem], candidate: list[float], baseline: float) -> list[ItemResult]:
    out = []
    for item, mine in zip(asked, candidate, strict=True):
        arms: list[tuple[Arm, float]] = [("candidate", mine), ("baseline", baseline)]
        for arm, score in arms:
            out.append(ItemResult(item.key, item.suite, arm, 0, score, "x", None, None))
    return out


def test_operator_evidence_counts_as_it_is() -> None:
    suite = items("file:ops", 20)
    decision = decide_results(results(suite, [1.0] * 20, 0.0), [], RULE, suite)
    assert decision.passed
    assert decision.evidence["items_below_min_trust"] == 0
    assert decision.evidence["leave_one_out"] == []
    [source] = decision.evidence["sources"]
    assert source == {
        "suite": "file:ops",
        "source": "file",
        "items": 20,
        "by_trust": {"operator": 20},
        "authors": {},
    }


def test_one_untrusted_author_cannot_admit_a_candidate_alone() -> None:
    holdout = items("holdout", 30, ["mallory"])
    suite = items("file:ops", 20)
    scored = results(holdout, [1.0] * 30, 0.0) + results(suite, [0.0] * 20, 0.0)
    decision = decide_results(scored, [], RULE, holdout + suite)
    # Without the poisoner's items, the operator suite shows no gain.
    assert not decision.passed
    [reason] = decision.reasons
    assert reason.startswith("insufficient independent evidence: all 30 items below trust")
    assert "'mallory'" in reason and "below min_improvement" in reason
    [check] = decision.evidence["leave_one_out"]
    assert check["author"] == "mallory" and check["verdict"] == "rejected"
    assert check["items_removed"] == 30 and check["items_left"] == 20
    # The full evidence alone would have passed: the rule is what stopped it.
    assert decision.overall is not None and decision.overall.difference.low > 0


def test_with_no_operator_suite_one_author_is_insufficient() -> None:
    holdout = items("holdout", 30, ["mallory"])
    decision = decide_results(results(holdout, [1.0] * 30, 0.0), [], RULE, holdout)
    assert not decision.passed
    assert decision.reasons[0].startswith("insufficient independent evidence")
    assert "0 items evaluated" in decision.reasons[0]


def test_a_gain_the_operator_suite_confirms_passes() -> None:
    holdout = items("holdout", 30, ["alice"])
    suite = items("file:ops", 20)
    scored = results(holdout, [1.0] * 30, 0.0) + results(suite, [1.0] * 15 + [0.0] * 5, 0.0)
    decision = decide_results(scored, [], RULE, holdout + suite)
    assert decision.passed, decision.reasons
    assert decision.reasons[-1].startswith("independent evidence: the rule holds with any one")
    assert [c["verdict"] for c in decision.evidence["leave_one_out"]] == ["passed"]


def test_ten_independent_authors_admit_a_candidate() -> None:
    holdout = items("holdout", 60, [f"user-{n}" for n in range(10)])
    decision = decide_results(results(holdout, [1.0] * 60, 0.0), [], RULE, holdout)
    assert decision.passed
    checks = decision.evidence["leave_one_out"]
    assert len(checks) == 10 and all(c["verdict"] == "passed" for c in checks)
    [source] = decision.evidence["sources"]
    assert source["by_trust"] == {"user": 60} and len(source["authors"]) == 10


def test_one_author_carrying_the_whole_gain_among_ten_is_rejected() -> None:
    authors = [f"user-{n}" for n in range(10)]
    holdout = items("holdout", 60, authors)
    # Only user-3's items show a gain; everyone else's are a tie.
    gains = [1.0 if item.provenance.authors == ("user-3",) else 0.0 for item in holdout]
    decision = decide_results(results(holdout, gains, 0.0), [], RULE, holdout)
    assert not decision.passed
    assert decision.reasons[0].startswith("not independent: without the 6 items of author")
    assert decision.evidence["failed_authors"] == ["user-3"]


def test_evidence_min_trust_user_counts_users_as_trusted() -> None:
    holdout = items("holdout", 30, ["alice"])
    rule = RULE.model_copy(update={"evidence_min_trust": "user"})
    decision = decide_results(results(holdout, [1.0] * 30, 0.0), [], rule, holdout)
    assert decision.passed
    assert decision.evidence["items_below_min_trust"] == 0
    untrusted = items("holdout", 30, ["mallory"], trust="untrusted")
    decision = decide_results(results(untrusted, [1.0] * 30, 0.0), [], rule, untrusted)
    assert not decision.passed


def test_a_rejection_for_other_reasons_is_not_rechecked() -> None:
    holdout = items("holdout", 30, ["alice"])
    decision = decide_results(results(holdout, [0.0] * 30, 0.0), [], RULE, holdout)
    assert not decision.passed
    assert decision.evidence["leave_one_out"] == []
    assert not decision.reasons[0].startswith("insufficient independent")


def test_items_survive_the_round_trip_with_their_provenance() -> None:
    [item] = items("holdout", 1, ["alice"], trust="untrusted")
    assert EvalItem.from_dict(item.as_dict()) == item
    assert item.as_dict()["provenance"] == {
        "source": "holdout",
        "trust": "untrusted",
        "authors": ["alice"],
    }
