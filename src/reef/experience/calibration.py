"""How far computed feedback can be trusted, measured against posted feedback.

``calibrate`` takes every record of a scenario that carries both computed feedback
(``signal:*``, ``judge:*``) and feedback someone posted (``explicit``), and compares, per
computed source:

- each side's *verdict* on the answer: posted feedback says *bad* when it corrects the
  answer or its mean score is below 0.5, else *good* (posted feedback with neither a
  score nor a correction gives no verdict); a computed row says *good* when its score is
  at least 0.5;
- ``precision``: of the source's rows on records with a posted verdict, the share whose
  verdict agrees;
- ``recall``: of the records whose posted verdict is the source's polarity (*bad* for a
  complaint, *good* for an acceptance), the share the source flagged;
- ``corrections_agree``: of the records where both the source and a person gave a text
  correction, the share where they are the same text (case and spacing aside).

``reef feedback calibrate --scenario s`` prints it, ``GET
/reef/scenarios/{s}/feedback/calibration`` serves it (the dashboard's feedback page
shows it), and ``selection.min_source_precision`` acts on it. With no record graded
both ways a source's figures are None: nothing has measured it yet.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reef.experience.records import EXPLICIT, FeedbackView, RecordView
from reef.experience.store import ExperienceStore

GOOD_AT = 0.5


@dataclass(frozen=True)
class SourceCalibration:
    """One computed source measured against posted feedback (module doc)."""

    source: str
    rows: int
    compared: int
    agree: int
    polarity: str  # "good" or "bad": what the source mostly says
    flagged_of_posted: int
    posted_of_polarity: int
    corrections_compared: int
    corrections_equal: int

    @property
    def precision(self) -> float | None:
        return self.agree / self.compared if self.compared else None

    @property
    def recall(self) -> float | None:
        if not self.posted_of_polarity:
            return None
        return self.flagged_of_posted / self.posted_of_polarity

    @property
    def corrections_agree(self) -> float | None:
        if not self.corrections_compared:
            return None
        return self.corrections_equal / self.corrections_compared

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, with the derived figures."""
        return {
            "source": self.source,
            "rows": self.rows,
            "compared": self.compared,
            "polarity": self.polarity,
            "precision": self.precision,
            "recall": self.recall,
            "corrections_compared": self.corrections_compared,
            "corrections_agree": self.corrections_agree,
        }


def calibrate(store: ExperienceStore, scenario: str) -> list[SourceCalibration]:
    """Every computed source of ``scenario`` measured against posted feedback."""
    return calibrate_records(store.iter_export(scenario))


def calibrate_records(records: Iterable[RecordView]) -> list[SourceCalibration]:
    """``calibrate`` over ``records`` (each with its feedback)."""
    posted: dict[str, str] = {}  # record id -> posted verdict
    posted_fix: dict[str, str] = {}
    fired: dict[str, list[tuple[str, FeedbackView]]] = defaultdict(list)  # source -> rows
    for record in records:
        explicit = [fb for fb in record.feedback if fb.source == EXPLICIT]
        verdict = _posted_verdict(explicit)
        if verdict is not None:
            posted[record.id] = verdict
        fixes = [fb.correction for fb in explicit if isinstance(fb.correction, str)]
        if fixes:
            posted_fix[record.id] = fixes[-1]
        for fb in record.feedback:
            if fb.source != EXPLICIT and fb.score is not None:
                fired[fb.source].append((record.id, fb))
    return [_measure(source, rows, posted, posted_fix) for source, rows in sorted(fired.items())]


def _posted_verdict(feedback: list[FeedbackView]) -> str | None:
    if any(fb.correction is not None for fb in feedback):
        return "bad"
    scores = [fb.score for fb in feedback if fb.score is not None]
    if not scores:
        return None
    return "good" if sum(scores) / len(scores) >= GOOD_AT else "bad"


def _measure(
    source: str,
    rows: list[tuple[str, FeedbackView]],
    posted: dict[str, str],
    posted_fix: dict[str, str],
) -> SourceCalibration:
    verdicts = {record_id: _verdict(fb) for record_id, fb in rows}
    polarity = Counter(verdicts.values()).most_common(1)[0][0]
    compared = [rid for rid in verdicts if rid in posted]
    agree = sum(1 for rid in compared if verdicts[rid] == posted[rid])
    of_polarity = [rid for rid, verdict in posted.items() if verdict == polarity]
    flagged = sum(1 for rid in of_polarity if verdicts.get(rid) == polarity)
    fixes = [
        (fb.correction, posted_fix[rid])
        for rid, fb in rows
        if isinstance(fb.correction, str) and rid in posted_fix
    ]
    equal = sum(1 for mine, theirs in fixes if _same_text(mine, theirs))
    return SourceCalibration(
        source=source,
        rows=len(rows),
        compared=len(compared),
        agree=agree,
        polarity=polarity,
        flagged_of_posted=flagged,
        posted_of_polarity=len(of_polarity),
        corrections_compared=len(fixes),
        corrections_equal=equal,
    )


def _verdict(feedback: FeedbackView) -> str:
    return "good" if (feedback.score or 0.0) >= GOOD_AT else "bad"


def _same_text(first: str, second: str) -> bool:
    return " ".join(first.lower().split()) == " ".join(second.lower().split())
