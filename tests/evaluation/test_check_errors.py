"""The gate's error budget: too many failed calls fail the evaluation with a message that
says which item failed first and how, and whether the failures can pass."""

from __future__ import annotations

import pytest

from reef.evaluation.decision import score_answers
from reef.evaluation.gate import EvaluationFailedError, check_errors
from reef.evaluation.results import EvaluationStore
from reef.evaluation.scorers import ScorerContext, ScorerRegistry
from reef.evaluation.values import (
    TRANSIENT_ERROR_KINDS,
    Answer,
    ErrorKind,
    EvalItem,
    error_kind_of_status,
)
from reef.experience import SQLExperienceStore
from tests.experience.conftest import pg_databases, pg_url, store_url  # noqa: F401


def answer(key: str, error: str | None = None, kind: ErrorKind | None = None) -> Answer:
    text = None if error is not None else "fine"
    return Answer(key, "candidate", 0, text, "rec", error, 1.0, error_kind=kind)


def test_the_message_counts_failures_by_kind_and_names_the_first_item() -> None:
    refusal = "gateway answered 400: messages.2: Value error, tool_calls[0].function.name"
    answers = [
        *(answer(f"holdout/rec_{n}", refusal, "refused") for n in range(18)),
        answer("holdout/rec_a", "no reply within 120 s (after 3 attempts)", "timeout"),
        answer("file:quiz/q1", "gateway answered 502: down (after 3 attempts)", "upstream_error"),
        *(answer(f"holdout/ok_{n}") for n in range(52)),
    ]
    with pytest.raises(EvaluationFailedError) as failed:
        check_errors(answers, 0.1, [])
    assert failed.value.message == (
        "20 of 72 candidate calls failed (more than 10%): refused 18, timeout 1, "
        f"upstream_error 1; first: item rec_0 (holdout): {refusal}"
    )
    assert not failed.value.transient  # a refused item is refused again
    assert failed.value.kinds == {"refused": 18, "timeout": 1, "upstream_error": 1}


def test_failures_of_transient_kinds_only_are_transient() -> None:
    answers = [
        answer("file:quiz/q1", "no reply within 1 s", "timeout"),
        answer("file:quiz/q2", "gateway answered 429: slow down", "rate_limited"),
        answer("file:quiz/q3", "could not reach the gateway: ClientConnectorError", "unreachable"),
        answer("file:quiz/q4", "gateway answered 503: busy", "upstream_error"),
    ]
    with pytest.raises(EvaluationFailedError) as failed:
        check_errors(answers, 0.1, [])
    assert failed.value.transient
    assert "first: item q1 (file:quiz): no reply within 1 s" in failed.value.message


@pytest.mark.parametrize("kind", ["unreadable", None])
def test_an_unreadable_or_unclassified_failure_is_not_transient(kind: ErrorKind | None) -> None:
    answers = [answer("file:quiz/q1", "unreadable reply: the reply has no choices", kind)]
    with pytest.raises(EvaluationFailedError, match=f"{kind or 'other'} 1; first: item q1") as e:
        check_errors(answers, 0.1, [])
    assert not e.value.transient


def test_failures_within_the_budget_pass() -> None:
    answers = [answer("holdout/bad", "gateway answered 400: no", "refused")]
    answers += [answer(f"holdout/ok_{n}") for n in range(9)]
    check_errors(answers, 0.1, [])  # 1 of 10 is not more than 10%


def test_statuses_map_to_kinds() -> None:
    assert error_kind_of_status(400) == error_kind_of_status(413) == "refused"
    assert error_kind_of_status(429) == "rate_limited"
    assert error_kind_of_status(500) == error_kind_of_status(504) == "upstream_error"
    assert {"rate_limited", "upstream_error", "timeout", "unreachable"} == TRANSIENT_ERROR_KINDS


def test_the_error_kind_is_stored_with_the_result(store_url: str) -> None:  # noqa: F811
    item = EvalItem(id="rec_1", suite="holdout", messages=[{"role": "user", "content": "hi"}])
    refused = answer("holdout/rec_1", "gateway answered 400: messages.0: bad", "refused")
    [result] = score_answers(
        [item], [refused], {"type": "exact"}, ScorerRegistry(), ScorerContext(), 40
    )
    assert result.score == 0.0
    assert result.details == {"error": refused.error, "error_kind": "refused"}
    store = SQLExperienceStore.from_url(store_url)
    try:
        evaluations = EvaluationStore(store.database)
        evaluation_id = evaluations.start("shop", "cand", "base", [item], {}, "test")
        evaluations.add_results(evaluation_id, [result])
        [stored] = evaluations.results(evaluation_id)
        assert stored.error == refused.error and stored.details["error_kind"] == "refused"
    finally:
        store.close()
