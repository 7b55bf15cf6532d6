"""Experience selection: which records a learning run may train on, and which it must not.

``select_experience`` reads a scenario's records with their feedback and returns an
``ExperienceBatch``: ``train`` for learners, ``holdout`` for evaluation only, and
``stats`` counting every record or example dropped and why. The rules, in order:

1. Only records created at or before ``now``, with ``purpose == "serve"``,
   ``status == "ok"`` and an api that answers prompts (``after_now``, ``not_serve``,
   ``not_ok``, ``not_trainable``: embeddings records, ``reef.experience.TRAINABLE_APIS``).
   With ``imported: exclude``, records brought in by ``reef import`` are left out
   (``imported_excluded``); by default they train like served ones.
2. Screening (``reef.learning.screening``): feedback that is quarantined (held back by
   an earlier run and not released by an admin) or that this run's screening flags is
   left out as if it had never been given (``quarantined_held``, ``quarantined_new``,
   ``screened:<rule>``); the flags are returned in ``batch.flagged``.
3. Sessions become trajectories (``merge_sessions``): the session's last eligible turn,
   whose conversation already holds the earlier turns, is the one example; it carries
   the feedback of every turn of the session and lists every turn in ``source_ids``
   (``merged_turns`` counts the turns folded in). Without merging each record stands alone.
   A session with an outcome (feedback on the session, ``POST /reef/feedback`` with a
   ``session_id``; ``outcomes`` counts them) is instead one example per turn: ``credit``
   (``reef.learning.credit``) gives the turns of the outcome's branch their share of its
   score (and its correction to the turn it targets), as if given on each turn's record
   (``credited_turns``); each turn also keeps the feedback on its own record. Screening
   sees an outcome with the session's newest turn. A session with computed feedback
   (``reef.learning.computed``) is one example per turn as well: a conversation signal
   judges the answer of the turn it names, not the session's last.
4. Consumed: an example whose own record (the session's last turn) is in ``consumed``
   is skipped unless ``reuse_consumed`` (``consumed``). Earlier turns that were
   consumed may ride along in a newer turn's conversation: the newer turn is new signal.
   Skipped examples that pass the other rules are the *replay* pool: ``batch.replay`` is
   a fixed sample of it, at most ``replay_fraction`` of the training split and
   ``replay_max`` (``replay``), which a model learner continuing from the head's adapter
   trains on beside the new data so it does not forget what earlier releases learned.
5. Feedback filters: ``no_feedback``, ``below_min_score`` (no score counts as below),
   ``no_correction`` (``corrections_only``). Feedback counts by its source
   (``sources``: a weight per source, ``explicit``, ``signal``, ``judge`` or one named
   source such as ``signal:correction``; weight 0 leaves it out as if never given,
   ``source_excluded``): an example's score is the mean of its feedback's scores weighted
   by source weight times confidence (computed feedback's), and a correction someone wrote
   wins over one computed from the conversation (``computed_feedback`` counts those kept).
   With ``min_source_precision``, a computed source whose precision against posted
   feedback (``reef.learning.calibration``, on at least ``min_calibration_items`` answers
   graded both ways) is below it does not train until it measures better
   (``low_precision:<source>``).
6. Staleness: releases between the release that served the record and the head
   (``head.seq - served.seq``; a record served by no release, or by an id not on the
   chain, counts every release up to the head). Beyond ``max_staleness`` an example is
   dropped (``stale_dropped``) or kept with ``weight = stale_weight``
   (``stale_downweighted``).
7. Duplicates: the same conversation, reply and correction (``duplicate``); with
   ``dedup: embedding``, examples whose text is at least ``near_duplicate_threshold``
   cosine-similar to one already kept (``near_duplicate``). Preferred survivor: a
   correction first, then the higher score, then the newer record.
8. Holdout: ``holdout_bucket(key) < holdout_fraction * 1000`` where ``key`` is the id of
   the session's first record (every turn of a session shares it, so a conversation
   never straddles the split) — the same record always lands in the same split. With
   ``holdout_key: session`` the key is the session id itself: a client that names its
   sessions (``x-reef-session``) from what they hold gets the same split when the same
   traffic is sent again (record ids are drawn at random; the quickstart relies on it).
9. Per-principal cap, on each split: while some feedback principal (``None`` — anonymous
   feedback — is one principal) supplies more than ``max_per_principal`` of the split,
   its lowest-priority examples go (``principal_cap``). With a single principal there is
   nobody to dilute, so the cap does not apply (``principal_cap_single_source`` = 1).
10. ``limit`` examples per split, highest priority first (``over_limit``).
11. Evidence kept apart: with ``suite_prompts`` (the gate's file suites), a training
    example whose prompt matches a suite item's (``reef.learning.overlap``: the same
    normalised text, or character 3-gram Jaccard at least 0.9) is left out of ``train``
    (``suite_overlap``; ``batch.overlap`` names each record and the item it matched).

Dropped evidence is counted too: ``complaint_without_value`` is the number of examples
a conversation signal complained about (``signal:correction`` with no corrected value)
while no feedback gave the right value — neither a correction to learn nor a reference
for the gate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.core.errors import InvalidInputError
from reef.core.jsoncodec import canonical_json, sha256_hex
from reef.core.routing import SERVED_BY_TAG
from reef.core.trust import Trust
from reef.experience import (
    EXPLICIT,
    IMPORT_ORIGIN_PREFIX,
    ORIGIN_TAG,
    TRAINABLE_APIS,
    ExperienceStore,
    FeedbackView,
    RecordView,
    calibrate_records,
    canonical_correction,
    canonical_exchange,
    chat_messages,
    check_source_weights,
    source_kind,
)
from reef.learning.base import ExperienceBatch, TrainingExample
from reef.learning.credit import CreditConfig, credited_feedback
from reef.learning.learners._similarity import example_text, similarity_matrix
from reef.learning.overlap import SuiteMatcher, SuitePrompt, last_user_text
from reef.learning.screening import (
    ScreeningConfig,
    TrustedReference,
    rule_of,
    screen_feedback,
)
from reef.releases import Release, ReleaseChain

HOLDOUT_BUCKETS = 1000
COMPLAINT_SOURCE = "signal:correction"


# Every source trains by default, computed feedback weighted by its confidence; the
# gate's evidence is explicit feedback only (``GateConfig.evidence_sources``).
DEFAULT_SOURCES: dict[str, float] = {"explicit": 1.0, "signal": 1.0, "judge": 1.0}


class SelectionConfig(BaseModel):
    """How a recipe selects experience (see the module docstring for each rule)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    purpose: Literal["serve"] = "serve"
    min_score: float | None = None
    require_feedback: bool = True
    corrections_only: bool = False
    max_staleness: int | None = Field(default=None, ge=0)
    stale: Literal["drop", "downweight"] = "drop"
    stale_weight: float = Field(default=0.5, gt=0.0, le=1.0)
    holdout_fraction: float = Field(default=0.2, ge=0.0, le=1.0)
    holdout_key: Literal["record", "session"] = Field(
        default="record",
        description="What the holdout split hashes: record (the session's first record's "
        "id, the default) or session (the session id, stable across runs when the client "
        "names its sessions with x-reef-session). Changing it moves records between the "
        "splits: set it before the first learning run.",
    )
    max_per_principal: float | None = Field(default=0.5, gt=0.0, le=1.0)
    dedup: Literal["exact", "embedding"] = "exact"
    near_duplicate_threshold: float = Field(default=0.95, gt=0.0, le=1.0)
    reuse_consumed: bool = False
    limit: int = Field(default=2000, ge=1)
    merge_sessions: bool = True
    credit: CreditConfig = Field(default_factory=CreditConfig)
    screening: ScreeningConfig = Field(default_factory=ScreeningConfig)
    replay_fraction: float = Field(default=0.5, ge=0.0, le=10.0)
    replay_max: int = Field(default=500, ge=0)
    sources: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_SOURCES))
    min_source_precision: float | None = Field(default=None, ge=0.0, le=1.0)
    min_calibration_items: int = Field(default=20, ge=1)
    imported: Literal["include", "exclude"] = Field(
        default="include",
        description="Whether records brought in by `reef import` (origin import:<format>) "
        "may train: include (the default: imported history is the point of importing) or "
        "exclude (only traffic served through the gateway).",
    )

    @field_validator("sources")
    @classmethod
    def _known_sources(cls, sources: dict[str, float]) -> dict[str, float]:
        try:
            check_source_weights(sources)
        except InvalidInputError as exc:
            raise ValueError(f"sources: {exc}") from exc
        return {**DEFAULT_SOURCES, **sources}  # named sources adjust the defaults

    def weight_of(self, feedback: FeedbackView, failing: frozenset[str] = frozenset()) -> float:
        """How much ``feedback`` counts (0: left out): its source's weight (the exact
        source, else its kind's, else 0) times its confidence, when computed; 0 for a
        source in ``failing`` (measured below ``min_source_precision``)."""
        if feedback.source in failing:
            return 0.0
        weight = self.sources.get(feedback.source)
        if weight is None:
            weight = self.sources.get(source_kind(feedback.source), 0.0)
        return weight * (feedback.confidence if feedback.confidence is not None else 1.0)


def holdout_bucket(key: str) -> int:
    """The record's fixed bucket in [0, 1000): ``int(sha256(key)) mod 1000``."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest(), "big") % HOLDOUT_BUCKETS


def in_holdout(key: str, fraction: float) -> bool:
    """Whether the session keyed by ``key`` (its first record's id) is held out."""
    return holdout_bucket(key) < fraction * HOLDOUT_BUCKETS


def select_experience(  # noqa: PLR0913
    store: ExperienceStore,
    chain: ReleaseChain,
    scenario: str,
    config: SelectionConfig,
    consumed: Iterable[str] = frozenset(),
    now: datetime | None = None,
    trusted: Sequence[TrustedReference] = (),
    suite_prompts: Sequence[SuitePrompt] = (),
) -> ExperienceBatch:
    """Select ``scenario``'s experience for one learning run (rules: module docstring).

    ``consumed`` are record ids already used by a published candidate; ``now`` bounds the
    snapshot (records created later are ignored; default: the current time); ``trusted``
    the operator suites' items for screening; ``suite_prompts`` the gate's suite items
    that training must stay apart from (rule 11). Reads only — what screening flags is in
    ``batch.flagged`` for the caller to quarantine; raises ``StoreUnavailableError`` when
    the database is down.
    """
    stats: Counter[str] = Counter()
    cutoff = now or datetime.now(UTC)
    head = chain.head(scenario)
    seqs = _release_seqs(chain, scenario) if head is not None else {}
    records = list(store.iter_export(scenario))
    stats["records"] = len(records)
    anchors = _session_anchors(records)
    used = set(consumed)
    failing = _failing_sources(records, config, stats)
    eligible = _weighed(
        list(_eligible(records, cutoff, stats, config.imported == "exclude")),
        config,
        stats,
        failing,
    )
    outcomes = _outcomes(store.session_feedback(scenario), eligible)
    screened = _with_outcomes(eligible, outcomes)
    reasons = screen_feedback(screened, config.screening, trusted)
    stats.update("screened:" + rule_of(reason) for found in reasons.values() for reason in found)
    flagged = {feedback_id: "; ".join(found) for feedback_id, found in reasons.items()}
    stats["quarantined_new"] = len(flagged)
    held = set(flagged) | {fb.id for r in screened for fb in r.feedback if fb.quarantined}
    stats["quarantined_held"] = len(held) - len(flagged)
    credits = _credits(records, outcomes, held, config.credit, stats)
    examples: list[TrainingExample] = []
    learned: list[TrainingExample] = []
    for unit, extra in _units(eligible, config.merge_sessions, stats, credits):
        example = _example(unit, anchors, head, seqs, config, used, stats, held, learned, extra)
        if example is not None:
            examples.append(example)
    examples = _deduplicate(by_priority(examples), config, stats)
    held_out = _held_out(anchors, config)
    train = [e for e in examples if not held_out(e)]
    holdout = [e for e in examples if held_out(e)]
    train, overlap = _apart_from_suites(train, suite_prompts, stats)
    train = _limit(_cap_principals(train, config.max_per_principal, stats), config, stats)
    holdout = _limit(_cap_principals(holdout, config.max_per_principal, stats), config, stats)
    replay = _replay(learned, len(train), config, held_out)
    stats["train"], stats["holdout"], stats["replay"] = len(train), len(holdout), len(replay)
    # Chronological order: UUIDv7 ids sort by creation time.
    return ExperienceBatch(
        train=sorted(train, key=lambda e: e.record_id),
        holdout=sorted(holdout, key=lambda e: e.record_id),
        stats=dict(stats),
        flagged=flagged,
        replay=sorted(replay, key=lambda e: e.record_id),
        overlap=overlap,
    )


def _apart_from_suites(
    train: list[TrainingExample], prompts: Sequence[SuitePrompt], stats: Counter[str]
) -> tuple[list[TrainingExample], dict[str, str]]:
    """``train`` without the examples whose prompt matches a suite item (rule 11), and
    record id -> the item each one matched."""
    matcher = SuiteMatcher(prompts)
    if not matcher:
        return train, {}
    kept: list[TrainingExample] = []
    overlap: dict[str, str] = {}
    for example in train:
        key = matcher.match(last_user_text(example.messages))
        if key is None:
            kept.append(example)
        else:
            overlap[example.record_id] = key
    if overlap:
        stats["suite_overlap"] = len(overlap)
    return kept, overlap


def _held_out(
    anchors: dict[str, str], config: SelectionConfig
) -> Callable[[TrainingExample], bool]:
    """Whether an example is held out (rule 8): its ``session_id`` is the anchor (the
    session's first record's id); ``holdout_key: session`` hashes the session id."""
    sessions = {anchor: session for session, anchor in anchors.items()}

    def held_out(example: TrainingExample) -> bool:
        key = example.session_id
        if config.holdout_key == "session":
            key = sessions.get(key, key)
        return in_holdout(key, config.holdout_fraction)

    return held_out


def _replay(
    learned: list[TrainingExample],
    fresh: int,
    config: SelectionConfig,
    held_out: Callable[[TrainingExample], bool],
) -> list[TrainingExample]:
    """A fixed pseudo-random sample (by content hash) of what earlier published releases
    learned from, at most ``replay_fraction`` of the fresh training examples and
    ``replay_max``; held-out sessions never (they were never trained on). By content, not
    record id: the same experience recorded again (ids are random) replays the same."""
    trained = [e for e in learned if not held_out(e)]
    size = min(len(trained), config.replay_max, math.floor(config.replay_fraction * fresh))
    ordered = sorted(
        trained,
        key=lambda e: (holdout_bucket(e.content_hash + ":replay"), e.content_hash, e.record_id),
    )
    return ordered[:size]


# -- reading -----------------------------------------------------------------------------


def _release_seqs(chain: ReleaseChain, scenario: str) -> dict[str, int]:
    seqs: dict[str, int] = {}
    before: int | None = None
    while True:
        page = chain.releases(scenario, limit=1000, before_seq=before)
        seqs.update((release.id, release.seq) for release in page)
        if len(page) < 1000:
            return seqs
        before = page[-1].seq


def _session_anchors(records: list[RecordView]) -> dict[str, str]:
    """Session id -> its first record's id (over every record, so it never moves)."""
    anchors: dict[str, tuple[int, datetime, str]] = {}
    for record in records:
        order = (record.turn, record.created_at, record.id)
        if record.session_id not in anchors or order < anchors[record.session_id]:
            anchors[record.session_id] = order
    return {session: order[2] for session, order in anchors.items()}


def _eligible(
    records: list[RecordView], cutoff: datetime, stats: Counter[str], no_imported: bool
) -> Iterator[RecordView]:
    for record in records:
        if no_imported and record.tags.get(ORIGIN_TAG, "").startswith(IMPORT_ORIGIN_PREFIX):
            stats["imported_excluded"] += 1
        elif record.created_at > cutoff:
            stats["after_now"] += 1
        elif record.purpose != "serve":
            stats["not_serve"] += 1
        elif record.status != "ok":
            stats["not_ok"] += 1
        elif record.api not in TRAINABLE_APIS:
            stats["not_trainable"] += 1
        else:
            yield record


def _failing_sources(
    records: list[RecordView], config: SelectionConfig, stats: Counter[str]
) -> frozenset[str]:
    """Computed sources whose precision against posted feedback, measured on at least
    ``min_calibration_items`` answers graded both ways, is below ``min_source_precision``
    (``low_precision:<source>`` counts their rows)."""
    if config.min_source_precision is None:
        return frozenset()
    failing = set()
    for source in calibrate_records(records):
        precision = source.precision
        if (
            precision is not None
            and source.compared >= config.min_calibration_items
            and precision < config.min_source_precision
        ):
            failing.add(source.source)
            stats[f"low_precision:{source.source}"] = source.rows
    return frozenset(failing)


def _weighed(
    records: list[RecordView],
    config: SelectionConfig,
    stats: Counter[str],
    failing: frozenset[str] = frozenset(),
) -> list[RecordView]:
    """``records`` without the feedback whose source does not count here (weight 0),
    as if it had never been given (``source_excluded``)."""
    kept: list[RecordView] = []
    for record in records:
        counted = tuple(fb for fb in record.feedback if config.weight_of(fb, failing) > 0)
        if len(counted) != len(record.feedback):
            stats["source_excluded"] += len(record.feedback) - len(counted)
            record = dataclasses.replace(record, feedback=counted)
        stats["computed_feedback"] += sum(1 for fb in counted if fb.source != EXPLICIT)
        kept.append(record)
    return kept


def _outcomes(
    found: Sequence[FeedbackView], eligible: Sequence[RecordView]
) -> dict[str, list[FeedbackView]]:
    """Session id -> its outcomes, for sessions with an eligible record."""
    sessions = {record.session_id for record in eligible}
    outcomes: dict[str, list[FeedbackView]] = {}
    for outcome in found:
        if outcome.session_id in sessions:
            outcomes.setdefault(outcome.session_id, []).append(outcome)
    return outcomes


def _with_outcomes(
    eligible: list[RecordView], outcomes: dict[str, list[FeedbackView]]
) -> list[RecordView]:
    """``eligible`` for screening: each outcome that targets no turn rides on its
    session's newest record (one that targets a turn is that record's feedback already)."""
    newest: dict[str, RecordView] = {}
    for record in eligible:
        if record.session_id in outcomes:
            order = (record.turn, record.created_at, record.id)
            known = newest.get(record.session_id)
            if known is None or order > (known.turn, known.created_at, known.id):
                newest[record.session_id] = record
    riders = {
        newest[session].id: tuple(o for o in found if not o.record_ids)
        for session, found in outcomes.items()
    }
    return [
        dataclasses.replace(record, feedback=record.feedback + riders[record.id])
        if riders.get(record.id)
        else record
        for record in eligible
    ]


def _credits(
    records: list[RecordView],
    outcomes: dict[str, list[FeedbackView]],
    held: set[str],
    config: CreditConfig,
    stats: Counter[str],
) -> dict[str, dict[str, list[FeedbackView]]]:
    """Session id -> record id -> the feedback its outcomes credit the record with, for
    each session with an outcome that is not held back."""
    live = {
        session: kept
        for session, found in outcomes.items()
        if (kept := [o for o in found if o.id not in held])
    }
    by_session: dict[str, list[RecordView]] = {}
    for record in records:
        if record.session_id in live:
            by_session.setdefault(record.session_id, []).append(record)
    credits: dict[str, dict[str, list[FeedbackView]]] = {}
    for session, turns in by_session.items():
        turns.sort(key=lambda r: (r.turn, r.created_at, r.id))
        credits[session] = credited_feedback(turns, live[session], config)
        stats["outcomes"] += len(live[session])
        stats["credited_turns"] += len(credits[session])
    return credits


def _units(
    records: Iterable[RecordView],
    merge: bool,
    stats: Counter[str],
    credits: dict[str, dict[str, list[FeedbackView]]],
) -> Iterator[tuple[list[RecordView], list[FeedbackView]]]:
    """Groups of records that become one example (the last one is the example's own),
    each with the feedback credited to it. A credited session's records stand alone, and
    so do those of a session with computed feedback: a signal judges one turn's answer."""
    records = list(records)
    judged = {r.session_id for r in records if any(fb.source != EXPLICIT for fb in r.feedback)}
    sessions: dict[str, list[RecordView]] = {}
    for record in records:
        credited = credits.get(record.session_id)
        if credited is not None:
            yield [record], credited.get(record.id, [])
        elif record.session_id in judged:
            yield [record], []
        elif merge:
            sessions.setdefault(record.session_id, []).append(record)
        else:
            yield [record], []
    for turns in sessions.values():
        turns.sort(key=lambda r: (r.turn, r.created_at, r.id))
        stats["merged_turns"] += len(turns) - 1
        yield turns, []


# -- one example -------------------------------------------------------------------------


def _example(  # noqa: PLR0913
    unit: list[RecordView],
    anchors: dict[str, str],
    head: Release | None,
    seqs: dict[str, int],
    config: SelectionConfig,
    consumed: set[str],
    stats: Counter[str],
    held: set[str],
    replayable: list[TrainingExample] | None = None,
    credited: Sequence[FeedbackView] = (),
) -> TrainingExample | None:
    record = unit[-1]
    if record.id in consumed and not config.reuse_consumed:
        stats["consumed"] += 1
        if replayable is not None:
            learned = _example(
                unit, anchors, head, seqs, config, set(), Counter(), held, None, credited
            )
            if learned is not None:
                replayable.append(learned)
        return None
    # An outcome reaches a turn only as credited (it may target the record too).
    own = [fb for fb in _feedback_of(unit) if fb.id not in held and fb.session_id is None]
    feedback = sorted([*own, *credited], key=lambda fb: (fb.created_at, fb.id))
    weighed = [(fb.score, config.weight_of(fb)) for fb in feedback if fb.score is not None]
    total = sum(weight for _, weight in weighed)
    score = sum(s * w for s, w in weighed) / total if total > 0 else None
    # A correction someone wrote outranks one computed from the conversation.
    written = sorted(feedback, key=lambda fb: fb.source == EXPLICIT)
    corrections = [fb.correction for fb in written if fb.correction is not None]
    complained = not corrections and any(fb.source == COMPLAINT_SOURCE for fb in feedback)
    if complained:
        stats["complaint_without_value"] += 1
    if config.require_feedback and not feedback:
        stats["no_feedback"] += 1
        return None
    if config.min_score is not None and (score is None or score < config.min_score):
        stats["below_min_score"] += 1
        return None
    if config.corrections_only and not corrections:
        stats["no_correction"] += 1
        return None
    staleness = _staleness(record, head, seqs)
    weight = 1.0
    if config.max_staleness is not None and staleness > config.max_staleness:
        if config.stale == "drop":
            stats["stale_dropped"] += 1
            return None
        stats["stale_downweighted"] += 1
        weight = config.stale_weight
    exchange = canonical_exchange(record)
    messages, response = exchange.messages, exchange.reply
    correction = _correction_value(corrections[-1]) if corrections else None
    hashed = canonical_json({"messages": messages, "response": response, "correction": correction})
    return TrainingExample(
        record_id=record.id,
        scenario=record.scenario,
        session_id=anchors.get(record.session_id, record.id),
        messages=messages,
        response=response,
        score=score,
        correction=correction,
        feedback=[fb.feedback for fb in feedback if fb.feedback is not None],
        principals=list(dict.fromkeys(fb.principal for fb in feedback)),
        reference_authors=_reference_authors(feedback),
        release_id=record.release_id,
        staleness=staleness,
        content_hash="sha256:" + sha256_hex(hashed),
        weight=weight,
        source_ids=tuple(r.id for r in unit),
        tools=tuple(exchange.tools),
        tool_choice=exchange.tool_choice,
        chat_messages=chat_messages(record, messages),
        complaint_without_value=complained,
        tags=dict(record.tags),
        served_by=_served_by(record),
        token_logprobs=_token_logprobs(record),
    )


def _served_by(record: RecordView) -> Literal["student", "teacher"] | None:
    """Who answered a distilled scenario's record (``reef.learning.teacher``), when the
    record says: its ``reef.served_by`` tag (``student`` or ``teacher``)."""
    served = record.tags.get(SERVED_BY_TAG)
    if served == "teacher":
        return "teacher"
    return "student" if served == "student" else None


def _token_logprobs(record: RecordView) -> tuple[dict[str, Any], ...]:
    """The token logprobs of a chat record's first choice, as the upstream sent them
    (``logprobs.content``); empty when it sent none."""
    response = record.response if record.api == "openai.chat" else None
    choices = response.get("choices") if isinstance(response, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return ()
    return tuple(item for item in content if isinstance(item, dict))


def _reference_authors(feedback: list[FeedbackView]) -> tuple[tuple[str | None, Trust], ...]:
    """Who decided what the right answer is: the author of the last correction, else
    every author whose feedback carries a score."""
    corrected = [fb for fb in feedback if fb.correction is not None]
    deciding = corrected[-1:] if corrected else [fb for fb in feedback if fb.score is not None]
    return tuple(dict.fromkeys((fb.principal, fb.trust) for fb in deciding))


def _feedback_of(unit: list[RecordView]) -> list[FeedbackView]:
    """Every feedback on the unit's records, once each, oldest first."""
    seen: dict[str, FeedbackView] = {}
    for record in unit:
        for fb in record.feedback:
            seen.setdefault(fb.id, fb)
    return sorted(seen.values(), key=lambda fb: (fb.created_at, fb.id))


def _staleness(record: RecordView, head: Release | None, seqs: dict[str, int]) -> int:
    if head is None:
        return 0
    served = seqs.get(record.release_id) if record.release_id is not None else None
    return head.seq - served if served is not None else head.seq


def _correction_value(raw: Any) -> Any:
    """An assistant message ``{"role": "assistant", "content": "..."}`` becomes its text;
    tool calls (``{"tool_calls": [...]}``) a canonical assistant message, as replies are."""
    if isinstance(raw, dict) and isinstance(raw.get("content"), str) and not raw.get("tool_calls"):
        return raw["content"]
    return canonical_correction(raw)


# -- batch rules -------------------------------------------------------------------------


def by_priority(examples: Iterable[TrainingExample]) -> list[TrainingExample]:
    """Best first: corrected, then higher score (no score last), then newer."""
    newest_first = sorted(examples, key=lambda e: e.record_id, reverse=True)
    return sorted(
        newest_first,
        key=lambda e: (e.correction is None, -(e.score if e.score is not None else -math.inf)),
    )


def _deduplicate(
    examples: list[TrainingExample], config: SelectionConfig, stats: Counter[str]
) -> list[TrainingExample]:
    seen: set[str] = set()
    unique: list[TrainingExample] = []
    for example in examples:
        if example.content_hash in seen:
            stats["duplicate"] += 1
            continue
        seen.add(example.content_hash)
        unique.append(example)
    if config.dedup != "embedding" or len(unique) < 2:
        return unique
    similarity = similarity_matrix([example_text(e) for e in unique], "embedding")
    kept: list[int] = []
    for i in range(len(unique)):
        if any(similarity[i][j] >= config.near_duplicate_threshold for j in kept):
            stats["near_duplicate"] += 1
        else:
            kept.append(i)
    return [unique[i] for i in kept]


def _cap_principals(
    examples: list[TrainingExample], share: float | None, stats: Counter[str]
) -> list[TrainingExample]:
    """Drop lowest-priority examples until no principal supplies more than ``share``."""
    if share is None or share >= 1.0:
        return examples
    if len({p for e in examples for p in e.principals}) < 2:
        if examples:
            stats["principal_cap_single_source"] = 1
        return examples
    kept = examples
    while True:
        cap = max(1, math.floor(share * len(kept)))
        counts: Counter[str | None] = Counter()
        survivors = []
        for example in kept:
            if any(counts[p] >= cap for p in example.principals):
                stats["principal_cap"] += 1
                continue
            counts.update(set(example.principals))
            survivors.append(example)
        if len(survivors) == len(kept):
            return kept
        kept = survivors


def _limit(
    examples: list[TrainingExample], config: SelectionConfig, stats: Counter[str]
) -> list[TrainingExample]:
    stats["over_limit"] += max(0, len(examples) - config.limit)
    return examples[: config.limit]
