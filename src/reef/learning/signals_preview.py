"""``reef signals preview``: what the signal rules would make of recent traffic, written
nowhere.

``preview_signals`` reads the sessions of a scenario that gained serve records since a
time (at most ``limit`` of them, the most recently active first), runs the rules
(``reef.learning.signals.session_signals``) over each trajectory, and counts what they
found: signals per kind, corrections with a value extracted, and complaints without a
value (a ``correction`` signal whose message named no right answer: it scores the answer
0, but gives neither a training target nor a reference for the gate). A sample of each
comes with its record id, the answer judged and the user's message, so an operator can
check the rules on their own traffic before turning them on. It reads only.

With ``signals.extractor`` configured and ``models`` given, each complaint without a
value (at most ``max_calls_per_hour`` of them) is also read by the extractor's model, a
dry run: the model is called, nothing is recorded or written; ``extracted`` counts the
values it would add (sample kind ``extractor``), ``extractor_error`` says why it stopped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from reef.core.errors import ReefError
from reef.experience import ExperienceStore, RecordView, assemble_trajectory, canonical_exchange
from reef.learning.computed import sessions_since
from reef.learning.extractor import ModelExtractor
from reef.learning.signals import Signal, SignalsConfig, session_signals

SAMPLE = 5


@dataclass
class SignalPreview:
    """What the rules found (module doc); ``samples`` per kind (``correction``: with a
    value; ``complaint_without_value``; each signal name)."""

    scenario: str
    since: datetime
    sessions: int = 0
    answers: int = 0
    by_signal: dict[str, int] = field(default_factory=dict)
    corrections: int = 0
    complaints_without_value: int = 0
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    extractor_calls: int = 0
    extracted: int = 0
    extractor_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "scenario": self.scenario,
            "since": self.since.isoformat(),
            "sessions": self.sessions,
            "answers": self.answers,
            "by_signal": dict(sorted(self.by_signal.items())),
            "corrections": self.corrections,
            "complaints_without_value": self.complaints_without_value,
            "samples": self.samples,
            "extractor": {
                "calls": self.extractor_calls,
                "extracted": self.extracted,
                "error": self.extractor_error,
            },
        }


def preview_signals(  # noqa: PLR0913
    store: ExperienceStore,
    scenario: str,
    config: SignalsConfig,
    since: datetime,
    limit: int,
    now: datetime | None = None,
    sample: int = SAMPLE,
    models: Any = None,
) -> SignalPreview:
    """Run ``config``'s rules over the ``limit`` most recently active sessions of
    ``scenario`` since ``since``; counts and samples, nothing written. ``models``: a
    ``ConfiguredModel`` for the extractor's dry run (module doc)."""
    preview = SignalPreview(scenario, since)
    sessions = sessions_since(store, scenario, since)
    newest = sorted(sessions, key=lambda s: (sessions[s], s), reverse=True)[:limit]
    counts: Counter[str] = Counter()
    unread: list[tuple[Signal, RecordView]] = []
    for session in newest:
        records = store.get_session(scenario, session)
        trajectory = assemble_trajectory(scenario, session, records)
        answers = {record.id: record for record in records}
        preview.sessions += 1
        preview.answers += sum(1 for r in records if r.status == "ok")
        for signal in session_signals(trajectory, config, now=now):
            counts[signal.name] += 1
            kind: str = signal.name
            if signal.name == "correction":
                if signal.correction is None:
                    preview.complaints_without_value += 1
                    kind = "complaint_without_value"
                    if signal.record_id in answers:
                        unread.append((signal, answers[signal.record_id]))
                else:
                    preview.corrections += 1
            found = preview.samples.setdefault(kind, [])
            if len(found) < sample:
                found.append(_sampled(signal, answers.get(signal.record_id)))
    preview.by_signal = dict(counts)
    if config.extractor is not None and models is not None:
        extractor = ModelExtractor(store, models)
        _dry_run(extractor, config, unread, now or since, preview, sample)
    return preview


def _dry_run(
    extractor: ModelExtractor,
    config: SignalsConfig,
    unread: list[tuple[Signal, RecordView]],
    now: datetime,
    preview: SignalPreview,
    sample: int,
) -> None:
    """What the extractor would add for ``unread`` complaints, nothing recorded."""
    extractor_config = config.extractor
    assert extractor_config is not None  # the caller checked
    for signal, record in unread[: extractor_config.max_calls_per_hour]:
        try:
            found = extractor.extract(
                preview.scenario, extractor_config, record, signal.evidence, now, record=False
            )
        except ReefError as error:
            preview.extractor_error = f"{type(error).__name__}: {error}"
            return
        preview.extractor_calls += 1
        if found.value is None:
            continue
        preview.extracted += 1
        rows = preview.samples.setdefault("extractor", [])
        if len(rows) < sample:
            read = Signal(
                "correction", signal.record_id, 0.0, extractor_config.confidence,
                signal.evidence, correction=found.value,
            )  # fmt: skip
            rows.append(_sampled(read, record))


def _sampled(signal: Signal, record: RecordView | None) -> dict[str, Any]:
    reply = canonical_exchange(record).reply if record is not None else None
    content = reply.get("content") if isinstance(reply, dict) else None
    return {
        "record_id": signal.record_id,
        "signal": signal.name,
        "answer": content[:300] if isinstance(content, str) else None,
        "said": signal.evidence,
        "correction": signal.correction,
    }
