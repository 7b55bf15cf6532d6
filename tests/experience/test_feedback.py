"""Feedback: validation, record checks, idempotency, and how it attaches to records."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from reef.core.errors import InvalidInputError
from reef.experience import (
    FeedbackDraft,
    IdempotencyConflictError,
    RecordNotFoundError,
    SQLExperienceStore,
)
from tests.experience.conftest import DraftFactory


def feedback(record_ids: tuple[str, ...], **overrides: Any) -> FeedbackDraft:
    fields: dict[str, Any] = {
        "scenario": "support",
        "record_ids": record_ids,
        "score": 0.75,
        "feedback": {"comment": "good answer"},
        "correction": None,
        "metadata": {"grader": "unit"},
        "principal": "key-grader",
        "idempotency_key": None,
    }
    fields.update(overrides)
    return FeedbackDraft(**fields)


@pytest.fixture
def two_records(store: SQLExperienceStore, make_draft: DraftFactory) -> tuple[str, str]:
    a, b = make_draft(), make_draft()
    store.write_records([a, b])
    return a.id, b.id


def test_feedback_round_trips_onto_every_record_it_names(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, b = two_records
    draft = feedback(
        (b, a),
        correction={"role": "assistant", "content": "better"},
        idempotency_key="fb-1",
    )
    feedback_id, created = store.add_feedback(draft)
    assert created

    for record_id in (a, b):
        (view,) = store.get_record(record_id).feedback
        assert view.id == feedback_id
        assert view.scenario == "support"
        assert view.record_ids == (b, a)  # the order the client sent
        assert view.score == 0.75
        assert view.feedback == {"comment": "good answer"}
        assert view.correction == {"role": "assistant", "content": "better"}
        assert view.metadata == {"grader": "unit"}
        assert view.principal == "key-grader"
        assert view.idempotency_key == "fb-1"
        assert view.created_at.tzinfo is not None


def test_several_feedbacks_attach_oldest_first(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, _ = two_records
    first, _ = store.add_feedback(feedback((a,), score=1.0))
    second, _ = store.add_feedback(feedback((a,), score=None, feedback="text only"))
    views = store.get_record(a).feedback
    assert [v.id for v in views] == [first, second]
    assert views[1].score is None and views[1].feedback == "text only"


def test_same_key_same_body_returns_the_first_id(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, b = two_records
    first = store.add_feedback(feedback((a, b), idempotency_key="k"))
    # Same body; record ids in another order are the same feedback.
    again = store.add_feedback(feedback((b, a), idempotency_key="k"))
    assert first == (first[0], True)
    assert again == (first[0], False)
    assert len(store.get_record(a).feedback) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"score": 0.5},
        {"score": None},
        {"feedback": {"comment": "changed"}},
        {"correction": "a correction"},
        {"metadata": {"grader": "other"}},
    ],
)
def test_same_key_different_body_conflicts(
    store: SQLExperienceStore, two_records: tuple[str, str], change: dict[str, Any]
) -> None:
    a, _ = two_records
    store.add_feedback(feedback((a,), idempotency_key="k"))
    with pytest.raises(IdempotencyConflictError, match="'k'"):
        store.add_feedback(feedback((a,), idempotency_key="k", **change))


def test_same_key_other_records_conflicts(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, b = two_records
    store.add_feedback(feedback((a,), idempotency_key="k"))
    with pytest.raises(IdempotencyConflictError):
        store.add_feedback(feedback((a, b), idempotency_key="k"))


def test_feedback_keys_are_per_scenario(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    x, y = make_draft(scenario="x"), make_draft(scenario="y")
    store.write_records([x, y])
    fx, created_x = store.add_feedback(feedback((x.id,), scenario="x", idempotency_key="k"))
    fy, created_y = store.add_feedback(
        feedback((y.id,), scenario="y", idempotency_key="k", score=0.1)
    )
    assert created_x and created_y and fx != fy


@pytest.mark.parametrize("score", [math.nan, math.inf, -math.inf])
def test_non_finite_scores_are_invalid(
    store: SQLExperienceStore, two_records: tuple[str, str], score: float
) -> None:
    with pytest.raises(InvalidInputError, match="finite"):
        store.add_feedback(feedback((two_records[0],), score=score))


@pytest.mark.parametrize("score", ["0.5", True])
def test_non_numeric_scores_are_invalid(
    store: SQLExperienceStore, two_records: tuple[str, str], score: Any
) -> None:
    with pytest.raises(InvalidInputError, match="number"):
        store.add_feedback(feedback((two_records[0],), score=score))


def test_integer_score_is_stored_as_float(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    store.add_feedback(feedback((two_records[0],), score=1))
    (view,) = store.get_record(two_records[0]).feedback
    assert view.score == 1.0 and isinstance(view.score, float)


def test_no_record_ids_is_invalid(store: SQLExperienceStore) -> None:
    with pytest.raises(InvalidInputError, match="at least one"):
        store.add_feedback(feedback(()))


def test_unknown_record_is_named_and_nothing_is_stored(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, b = two_records
    with pytest.raises(RecordNotFoundError, match="ghost-1") as raised:
        store.add_feedback(feedback((a, "ghost-1", b, "ghost-2"), idempotency_key="k"))
    assert raised.value.record_id == "ghost-1"
    assert store.get_record(a).feedback == ()
    # The failed attempt did not consume the key.
    assert store.add_feedback(feedback((a,), idempotency_key="k"))[1] is True


def test_record_of_another_scenario_is_not_found(
    store: SQLExperienceStore, make_draft: DraftFactory
) -> None:
    elsewhere = make_draft(scenario="billing")
    store.write_records([elsewhere])
    with pytest.raises(RecordNotFoundError, match=elsewhere.id):
        store.add_feedback(feedback((elsewhere.id,), scenario="support"))


def test_unserialisable_feedback_is_invalid(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    with pytest.raises(InvalidInputError, match="JSON"):
        store.add_feedback(feedback((two_records[0],), feedback={"when": object()}))


def test_duplicate_record_ids_are_stored_once(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, _ = two_records
    store.add_feedback(feedback((a, a)))
    (view,) = store.get_record(a).feedback
    assert view.record_ids == (a,)


def test_new_feedback_count_counts_the_scenarios_feedback_after_a_time(
    store: SQLExperienceStore, two_records: tuple[str, str]
) -> None:
    a, b = two_records
    assert store.new_feedback_count("support", None) == 0
    first, _ = store.add_feedback(feedback((a,)))
    when = store.get_feedback(first).created_at
    assert store.new_feedback_count("support", None) == 1
    assert store.new_feedback_count("support", when) == 0  # strictly after
    assert store.new_feedback_count("support", when - timedelta(microseconds=1)) == 1
    store.add_feedback(feedback((b,), score=0.0))
    assert store.new_feedback_count("support", None) == 2
    assert store.new_feedback_count("support", when - timedelta(microseconds=1)) == 2
    assert store.new_feedback_count("other", None) == 0
