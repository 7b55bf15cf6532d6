"""Void, don't zero: an answer that infrastructure failed is void for both arms, counted
and reported, never scored. A real gateway in front of an oracle upstream that answers
500 to the head's calls on 30% of the items."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp import web

from reef.evaluation.config import GateRule
from reef.evaluation.decision import decide_results, score_answers
from reef.evaluation.scorers import ScorerContext, ScorerRegistry
from reef.evaluation.values import Answer, EvalItem, ItemResult
from reef.learning.reflect import ReflectError
from tests.evaluation.gate_setup import fact, quiz_world, write_suite
from tests.fakes.oracle import OracleUpstreamThread

ALL = [fact(i) for i in range(40)]
FLAKY = "serving-head"


class FlakyOracle(OracleUpstreamThread):
    """The oracle, but a call whose system prompt carries ``FLAKY`` and asks question
    ``i`` with ``i % 10 < 3`` is answered 500."""

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body.get("messages") or []
        system = " ".join(str(m.get("content")) for m in messages if m.get("role") == "system")
        asked = str(messages[-1].get("content") or "") if messages else ""
        number = asked.rpartition(" ")[2]
        if FLAKY in system and number.isdigit() and int(number) % 10 < 3:
            return web.json_response({"error": {"message": "upstream down"}}, status=500)
        return await super()._chat(request)


def test_an_outage_on_the_head_arm_is_undecided_not_a_candidate_win(tmp_path: Path) -> None:
    write_suite(tmp_path / "quiz.jsonl", range(40))
    with quiz_world(tmp_path, oracle_thread=FlakyOracle()) as world:
        # The head and the candidate know the same facts: only the outage tells them apart.
        base = world.chain.publish(
            world.propose(ALL, extra=FLAKY).id, world.head().id, "test", "setup",
            require_passed=False,
        )  # fmt: skip
        candidate = world.propose(ALL)
        outcome = world.gate(suites=["quiz.jsonl"], retries=0).run(candidate.id)

        assert outcome.action == "undecided"
        decision = outcome.decision
        assert decision is not None and decision.verdict == "undecided"
        assert decision.voids["void"] == 12 and decision.voids["items"] == 40
        assert decision.voids["by_kind"] == {"upstream_error": 12}
        assert (
            "12 of 40 items void (upstream_error 12), more than max_void_fraction 10%"
            in (decision.reasons[0])
        )
        # void items are scored for neither arm: the rest is a tie, not a gain
        assert decision.overall is not None and decision.overall.items == 28
        assert decision.overall.difference.mean == 0.0
        assert world.head().id == base.id
        stored = world.chain.get_candidate(candidate.id)
        assert stored.state == "evaluating"
        gate = (stored.evidence or {})["gate"]
        assert [look["verdict"] for look in gate["history"]] == ["undecided"]
        assert gate["decision"]["missing"][0] == (
            "answers to the 12 void items (asked again on the next look)"
        )
        # every answer is stored; the void ones say so
        results = world.evaluations.results(outcome.evaluation_id or "")
        assert sum(r.void for r in results) == 12 and all(
            r.arm == "baseline" for r in results if r.void
        )

        # Allowed that many voids, the tie is not a win either.
        again = world.gate(suites=["quiz.jsonl"], retries=0, max_void_fraction=0.5).run(
            world.propose(ALL).id
        )
        assert again.decision is not None and not again.decision.passed
        assert world.head().id == base.id


def _result(key: str, arm: str, score: float, **details: object) -> ItemResult:
    return ItemResult(
        item_key=key, suite="file:q", arm="candidate" if arm == "c" else "baseline",
        repeat=0, score=score, output=None, record_id=None, error=None, details=dict(details),
    )  # fmt: skip


def test_a_refused_answer_still_scores_and_a_void_one_does_not() -> None:
    rule = GateRule(min_items=2, method="bootstrap", bootstrap_samples=100)
    results = [
        _result("file:q/1", "c", 1.0), _result("file:q/1", "b", 0.0),
        _result("file:q/2", "c", 0.0, error_kind="refused"), _result("file:q/2", "b", 1.0),
        _result("file:q/3", "c", 1.0),
        _result("file:q/3", "b", 0.0, error_kind="timeout", void=True),
    ]  # fmt: skip
    decision = decide_results(results, [], rule)
    assert decision.overall is not None and decision.overall.items == 2  # q3 is void
    assert decision.overall.difference.mean == 0.0  # the refusal counted as a miss
    assert decision.voids["void"] == 1 and decision.voids["by_kind"] == {"timeout": 1}
    assert decision.verdict == "undecided"  # 1 of 3 void is over 10%


class DownJudge:
    """A judge model whose upstream cannot be reached, as ``UpstreamReflector`` says so."""

    def ask(
        self, messages: list[dict[str, Any]], upstream: str | None = None, model: str | None = None
    ) -> str:
        raise ReflectError("judge upstream unreachable: connection refused")


def test_a_judge_that_cannot_be_asked_voids_the_answer_instead_of_scoring_it() -> None:
    items = [EvalItem(id="1", suite="file:q", messages=[], reference="30 days")]
    answers = [Answer("file:q/1", "candidate", 0, "thirty days", None, None, 0.0)]
    spec = {"type": "llm_judge", "rubric": "Names the refund window.", "model": "m"}
    [result] = score_answers(
        items, answers, spec, ScorerRegistry(), ScorerContext(model=DownJudge()), 48
    )
    assert result.void and result.details["error_kind"] == "judge"
    assert "connection refused" in result.details["error"]
