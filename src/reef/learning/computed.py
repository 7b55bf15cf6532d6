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
from typing import Any

from reef.core.errors import ReefError
from reef.core.trust import Trust
from reef.experience import (
    ExperienceStore,
    FeedbackDraft,
    IdempotencyConflictError,
    RecordFilter,
    RecordView,
    Redactor,
    assemble_trajectory,
)
from reef.learning.extractor import SOURCE as EXTRACTOR_SOURCE
from reef.learning.extractor import ModelExtractor
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
    extractor_calls: int = 0
    extracted: int = 0
    extractor_skipped_budget: int = 0
    extractor_error: str | None = None


class SignalWriter:
    """Writes conversation signals as feedback (module doc); one per worker process.

    ``trust_of(principal, scenario)`` is the trust level of an API key id (None: no key)
    in a scenario, as the gateway gives posted feedback; ``redactor`` scrubs the records
    of the model extractor's calls, as the gateway scrubs what it stores.
    """

    def __init__(
        self, store: ExperienceStore, trust_of: TrustOf, redactor: Redactor | None = None
    ) -> None:
        self._store = store
        self._redactor = redactor
        self._trust_of = trust_of
        self._since: dict[str, datetime] = {}

    def run(
        self,
        scenario: str,
        config: SignalsConfig,
        now: datetime | None = None,
        models: Any = None,
    ) -> SignalPass:
        """One pass over ``scenario``'s new sessions; what it did. With
        ``config.extractor`` set, ``models`` (a ``ConfiguredModel``: ``UpstreamModels``)
        reaches the extractor's model (``reef.learning.extractor``)."""
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
        unread: list[tuple[Signal, dict[str, RecordView], dict[str, str]]] = []
        for trajectory, records in sessions:
            by_id = {record.id: record for record in records}
            done.sessions += 1
            for signal in session_signals(trajectory, config, now=now, vocabulary=vocabulary):
                done.found += 1
                if signal.name == "correction" and signal.correction is None:
                    unread.append((signal, by_id, trajectory.turn_of_record))
                if self._write(scenario, signal, by_id, trajectory.turn_of_record):
                    done.written += 1
                    done.by_signal[signal.name] = done.by_signal.get(signal.name, 0) + 1
                else:
                    done.already += 1
        if config.extractor is not None and models is not None and unread:
            self._extract(scenario, config, unread, models, now, done)
        self._since[scenario] = newest
        if done.written:
            log.info("signals for %r: %d written (%s)", scenario, done.written, done.by_signal)
        return done

    def _extract(
        self,
        scenario: str,
        config: SignalsConfig,
        unread: list[tuple[Signal, dict[str, RecordView], dict[str, str]]],
        models: Any,
        now: datetime,
        done: SignalPass,
    ) -> None:
        """Ask the model extractor for the value of each complaint the rules found none
        in, within its hourly budget; write each value found as its own row."""
        extractor_config = config.extractor
        assert extractor_config is not None  # the caller checked
        extractor = ModelExtractor(self._store, models, self._redactor)
        calls, asked = extractor.recent(scenario, now)
        budget = extractor_config.max_calls_per_hour - calls
        for signal, by_id, turn_of_record in unread:
            judged = by_id.get(signal.record_id)
            if judged is None or signal.record_id in asked:
                continue
            if any(fb.source == EXTRACTOR_SOURCE for fb in judged.feedback):
                continue
            if budget <= 0:
                done.extractor_skipped_budget += 1
                continue
            try:
                found = extractor.extract(scenario, extractor_config, judged, signal.evidence, now)
            except ReefError as error:
                done.extractor_error = f"{type(error).__name__}: {error}"
                log.warning("signal extractor of %r stopped: %s", scenario, done.extractor_error)
                return
            budget -= 1
            done.extractor_calls += 1
            if found.value is None:
                continue
            read = Signal(
                "correction",
                signal.record_id,
                0.0,
                extractor_config.confidence,
                signal.evidence,
                correction=found.value,
            )
            if self._write(scenario, read, by_id, turn_of_record, source=EXTRACTOR_SOURCE):
                done.extracted += 1
                done.written += 1

    def _sessions_since(self, scenario: str, since: datetime) -> dict[str, datetime]:
        return sessions_since(self._store, scenario, since)

    def _write(
        self,
        scenario: str,
        signal: Signal,
        records: dict[str, RecordView],
        turn_of_record: dict[str, str],
        source: str | None = None,
    ) -> bool:
        """Write ``signal`` once (as ``source``, default ``signal:<name>``); False when it
        was written before."""
        author = _author(signal, records, turn_of_record)
        key = author.principal if author is not None else None
        principal = signal_principal(author) if author is not None else None
        source = source or f"signal:{signal.name}"
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
