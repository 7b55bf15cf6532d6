"""Live teacher checks: the evidence a distilled scenario's canary is decided on when
nobody grades its traffic (``scenarios.<s>.distill.live_references``).

While a student release is a canary, a ``fraction`` of the records of both arms (the
canary's and the head's) is *checked*, drawn from each record's id
(``reef.core.routing.teacher_checked``, independent of the arm's draw, so the checked
records are an unbiased sample of what each arm served):

Only records of the API the teacher is asked in are checked (``TeacherChecks.api``: chat
completions for an OpenAI-compatible teacher, messages for an Anthropic one).

- a checked record the teacher answered (routed to it, or escalated) scores 1: its
  answer is the teacher's own, the reference itself;
- a checked record the student answered scores what the learning worker's check wrote
  on it (``reef.learning.live_references``): the teacher asked the same request, the
  student's answer scored against the teacher's with the gate's scorer, as feedback of
  source ``judge:teacher`` by the author ``teacher:<upstream>/<model>`` at trust
  ``operator`` (a reference Reef took from the configured teacher, as
  ``gate.holdout_teacher_references`` counts it);
- a checked student record whose check is not written yet is *pending*: every record
  from the first pending one on is left out on both arms, so a slow or failing teacher
  cannot tilt an arm toward the records that are already decided.

So the two arms compare the answers users got, each measured as agreement with the
teacher, under the canary's own rule (non-inferiority with a margin for a distilled
student). Owns: which records count and what each scores. Does not own: the teacher
calls (``reef.learning.live_references``) or the decision (``reef.evaluation.
canary_monitor``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from reef.core.routing import SERVED_BY_TAG, teacher_checked
from reef.experience import FeedbackView, RecordView

CHECK_SOURCE = "judge:teacher"
# The API a teacher is asked in, by its upstream's dialect: a check asks the teacher the
# record's own request, so only records of that API are checked.
CHECKED_API = {"openai": "openai.chat", "anthropic": "anthropic.messages"}


@dataclass(frozen=True)
class TeacherChecks:
    """A distilled scenario's live teacher checks: the ``fraction`` of records checked
    and the API its teacher answers in (``CHECKED_API``); records of other APIs are not
    checked."""

    fraction: float
    api: str

    @classmethod
    def of(cls, fraction: float, upstream_type: str) -> TeacherChecks:
        """The checks of a teacher on an upstream of ``upstream_type`` (``anthropic``
        answers messages; every other type, OpenAI chat completions)."""
        return cls(fraction, CHECKED_API["anthropic" if upstream_type == "anthropic" else "openai"])


def check_of(record: RecordView) -> FeedbackView | None:
    """The live teacher check written on ``record``, if any (the newest): feedback of
    source ``judge:teacher`` at trust ``operator`` (what the worker writes; posted
    feedback is always ``explicit``, and an admin's import keeps its own trust)."""
    found = [fb for fb in record.feedback if fb.source == CHECK_SOURCE and fb.trust == "operator"]
    return found[-1] if found else None


def needs_check(record: RecordView, checks: TeacherChecks) -> bool:
    """Whether the learning worker must ask the teacher about ``record``: checked, an
    answer of the student that came (``ok``), in the API the teacher answers, and not
    checked yet."""
    return (
        record.tags.get(SERVED_BY_TAG) == "student"
        and record.status == "ok"
        and record.response is not None
        and record.api == checks.api
        and teacher_checked(record.id, checks.fraction)
        and check_of(record) is None
    )


@dataclass(frozen=True)
class CheckedRecord:
    """A checked record as canary evidence: its score (None while it is pending, or
    when its check found nothing to compare) and when it was served."""

    record: RecordView
    score: float | None
    pending: bool


def checked_record(record: RecordView, checks: TeacherChecks) -> CheckedRecord | None:
    """``record`` as evidence of a live teacher check (module docstring), or None when
    it is not among the checked records (not drawn, not ``ok``, another API than the
    teacher is asked in, or an arm the record does not name)."""
    if (
        record.status != "ok"
        or record.api != checks.api
        or not teacher_checked(record.id, checks.fraction)
    ):
        return None
    served = record.tags.get(SERVED_BY_TAG)
    if served == "teacher":
        return CheckedRecord(record, 1.0, False)
    if served != "student":
        return None
    check = check_of(record)
    if check is None:
        return CheckedRecord(record, None, True)
    return CheckedRecord(record, check.score, False)


def settled(checked: Iterable[CheckedRecord]) -> list[CheckedRecord]:
    """The scored records served before the first pending one (module docstring)."""
    ordered = sorted(checked, key=lambda c: (c.record.created_at, c.record.id))
    first_pending: datetime | None = next((c.record.created_at for c in ordered if c.pending), None)
    return [
        c
        for c in ordered
        if c.score is not None and (first_pending is None or c.record.created_at < first_pending)
    ]
