"""Computed feedback: conversation signals written as feedback rows as records arrive.

``SignalWriter.run`` looks at the sessions of a scenario that gained records since its
last pass (at the first pass: the last ``signals.lookback_hours``), assembles each one's
trajectory, finds its signals (``reef.learning.signals``, with the labels the scenario's
answers of the pass show: ``observed_vocabulary``) and writes each as feedback on
the answer it judges: ``source: signal:<name>``, the rule's confidence, the evidence in
``feedback`` and ``metadata``, the extracted correction if any. The author is the
principal of the request that carried the evidence — the user who wrote "no, it's X" —
at that key's trust level, so screening and the gate's trust rules treat it as that
user's feedback. When one application key carries many end users, the author is the end
user that request named (``signal_principal``): the body's OpenAI ``user`` field, else
its Anthropic ``metadata.user_id``, else the ``x-reef-end-user`` header (kept as tag
``end_user``); the principal is then ``<key>/<end user>`` (``anonymous/<end user>`` with
no key), so screening, per-principal caps and leave-one-author-out count each end user
apart. The trust level stays the key's.

Writing is idempotent: each signal's idempotency key is ``signal:<name>:<record id>``,
so a pass repeated after a crash, or two workers, write each signal once; a signal
whose evidence changed since (rare: a branch grew) keeps its first row. Selection then
weighs the rows by ``selection.sources`` and their confidence; the gate does not take
them as evidence unless ``gate.evidence_sources`` says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from reef.core.trust import Trust
from reef.experience import (
    ExperienceStore,
    FeedbackDraft,
    IdempotencyConflictError,
    RecordFilter,
    RecordView,
    assemble_trajectory,
)
from reef.learning.signals import Signal, SignalsConfig, observed_vocabulary, session_signals

log = logging.getLogger(__name__)

PAGE = 500
END_USER_TAG = "end_user"  # what the gateway keeps ``x-reef-end-user`` as
MAX_END_USER_CHARS = 256

TrustOf = Callable[[str | None, str], Trust]


@dataclass
class SignalPass:
    """What one pass over a scenario did."""

    sessions: int = 0
    found: int = 0
    written: int = 0
    already: int = 0
    by_signal: dict[str, int] = field(default_factory=dict)


class SignalWriter:
    """Writes conversation signals as feedback (module doc); one per worker process.

    ``trust_of(principal, scenario)`` is the trust level of an API key id (None: no key)
    in a scenario, as the gateway gives posted feedback.
    """

    def __init__(self, store: ExperienceStore, trust_of: TrustOf) -> None:
        self._store = store
        self._trust_of = trust_of
        self._since: dict[str, datetime] = {}

    def run(self, scenario: str, config: SignalsConfig, now: datetime | None = None) -> SignalPass:
        """One pass over ``scenario``'s new sessions; what it did."""
        now = now or datetime.now(UTC)
        since = self._since.get(scenario, now - timedelta(hours=config.lookback_hours))
        if config.abandon_after_seconds is not None and "abandon" in config.enabled:
            # a session goes quiet without new records: look back far enough to see it
            since -= timedelta(seconds=config.abandon_after_seconds)
        done = SignalPass()
        newest = since
        sessions = []
        for session, last in self._sessions_since(scenario, since).items():
            newest = max(newest, last)
            records = self._store.get_session(scenario, session)
            sessions.append((assemble_trajectory(scenario, session, records), records))
        # labels the scenario answers with: a correction to one is heard like a value's
        vocabulary = observed_vocabulary(trajectory for trajectory, _ in sessions)
        for trajectory, records in sessions:
            by_id = {record.id: record for record in records}
            done.sessions += 1
            for signal in session_signals(trajectory, config, now=now, vocabulary=vocabulary):
                done.found += 1
                if self._write(scenario, signal, by_id, trajectory.turn_of_record):
                    done.written += 1
                    done.by_signal[signal.name] = done.by_signal.get(signal.name, 0) + 1
                else:
                    done.already += 1
        self._since[scenario] = newest
        if done.written:
            log.info("signals for %r: %d written (%s)", scenario, done.written, done.by_signal)
        return done

    def _sessions_since(self, scenario: str, since: datetime) -> dict[str, datetime]:
        return sessions_since(self._store, scenario, since)

    def _write(
        self,
        scenario: str,
        signal: Signal,
        records: dict[str, RecordView],
        turn_of_record: dict[str, str],
    ) -> bool:
        """Write ``signal`` once; False when it was written before."""
        author = _author(signal, records, turn_of_record)
        key = author.principal if author is not None else None
        principal = signal_principal(author) if author is not None else None
        source = f"signal:{signal.name}"
        draft = FeedbackDraft(
            scenario=scenario,
            record_ids=(signal.record_id,),
            score=signal.score,
            feedback=signal.evidence,
            correction=signal.correction,
            metadata={
                "signal": signal.name,
                "evidence_record_id": None if author is None else author.id,
            },
            principal=principal,
            idempotency_key=f"{source}:{signal.record_id}",
            trust=self._trust_of(key, scenario),
            source=source,
            confidence=signal.confidence,
        )
        try:
            _, created = self._store.add_feedback(draft)
        except IdempotencyConflictError:
            return False  # written before, from evidence that has changed since
        return created


def sessions_since(store: ExperienceStore, scenario: str, since: datetime) -> dict[str, datetime]:
    """Session id -> its newest record's time, for sessions with serve records created
    after ``since``."""
    found: dict[str, datetime] = {}
    cursor: str | None = None
    filters = RecordFilter(since=since, purpose="serve")
    while True:
        page = store.list_records(scenario, filters, cursor, PAGE)
        for record in page.records:
            if record.created_at > found.get(record.session_id, since):
                found[record.session_id] = record.created_at
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def end_user_of(record: RecordView) -> str | None:
    """The end user ``record``'s request spoke for (module doc), else None."""
    request = record.request
    metadata = request.get("metadata")
    for value in (
        request.get("user"),
        metadata.get("user_id") if isinstance(metadata, dict) else None,
        record.tags.get(END_USER_TAG),
    ):
        if isinstance(value, str) and value.strip():
            return value.strip()[:MAX_END_USER_CHARS]
    return None


def signal_principal(record: RecordView) -> str | None:
    """Who wrote the evidence ``record`` carried: ``<key>/<end user>`` when the request
    named an end user, else the key (None: no key)."""
    end_user = end_user_of(record)
    if end_user is None:
        return record.principal
    return f"{record.principal or 'anonymous'}/{end_user}"


def _author(
    signal: Signal, records: dict[str, RecordView], turn_of_record: dict[str, str]
) -> RecordView | None:
    """The record whose request carried the evidence: the first later record of the
    session that continues the judged answer's turn; else the judged record itself."""
    judged = records.get(signal.record_id)
    if judged is None:
        return None
    later = [
        record
        for record in records.values()
        if record.created_at > judged.created_at
        and turn_of_record.get(record.id) != turn_of_record.get(judged.id)
    ]
    return min(later, key=lambda r: (r.created_at, r.id)) if later else judged
