"""Values that cross the experience boundary: what the gateway hands over, what reads return."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from reef.core import canonical_json, new_id, sha256_hex
from reef.core.errors import InvalidInputError
from reef.core.trust import Trust

# ``pending``: a stream whose receipt went out with its headers and whose end has not
# been written yet; the stream's end replaces it with its outcome. One left over after
# a crash is settled as ``aborted`` when a gateway next starts
# (``ExperienceStore.settle_pending``).
RecordStatus = Literal["ok", "error", "aborted", "pending"]
EXPLICIT = "explicit"  # the source of feedback posted to /reef/feedback
COMPUTED_KINDS = ("signal", "judge")
_SOURCE = re.compile(r"(signal|judge):[a-z0-9][a-z0-9_./-]{0,59}")
Purpose = Literal["serve", "eval", "canary", "judge", "shadow"]


@dataclass(frozen=True)
class StoredResponse:
    """One response kept for later turns.

    ``input_items`` is everything the response answered, oldest first, each item with
    its ``id``; ``response`` the response object as the client got it.
    """

    id: str
    scenario: str
    session_id: str
    record_id: str | None
    previous_response_id: str | None
    principal: str | None
    input_items: list[dict[str, Any]]
    response: dict[str, Any]
    created_at: datetime | None = None

    def conversation(self) -> list[dict[str, Any]]:
        """The items a continuation starts from: the input, then the output."""
        return [*self.input_items, *(self.response.get("output") or ())]


@dataclass(frozen=True)
class RecordDraft:
    """One exchange as the gateway saw it, ready to be written.

    ``id`` is allocated by the gateway before the upstream call so that the receipt can
    go out with the response headers. ``session_id`` is always set (from the header or
    inferred); the store assigns ``turn`` (previous turns in the session + 1).
    ``continuation_hash`` is the chained hash of the canonical conversation followed by
    the reply: a later request whose messages start with exactly that conversation
    joins the session (see ``reef.experience.sessions``).
    """

    id: str
    scenario: str
    session_id: str
    api: Literal[
        "openai.chat",
        "anthropic.messages",
        "openai.responses",
        "openai.completions",
        "openai.embeddings",
    ]
    request: dict[str, Any]
    response: dict[str, Any] | None
    status: RecordStatus
    error: str | None
    latency_ms: float
    usage: dict[str, Any] | None
    release_id: str | None
    prompt_hash: str
    content_hash: str
    continuation_hash: str | None
    tags: dict[str, str] = field(default_factory=dict)
    principal: str | None = None
    purpose: Purpose = "serve"
    idempotency_key: str | None = None
    created_at: datetime | None = None
    rendered_request: dict[str, Any] | None = None  # as sent upstream, when a harness changed it
    # True when the gateway minted ``session_id`` for this record: no earlier turn can
    # exist, so the store skips looking one up.
    session_is_new: bool = False
    # True when this is the outcome of a record stored earlier as ``pending`` (a
    # stream's): the store replaces that row's outcome columns instead of inserting one,
    # keeping its turn and ``created_at``.
    finishes_pending: bool = False
    # A Responses API answer kept for later turns (``ResponseStore``): written in the
    # same transaction as the record, so keeping it costs no commit of its own.
    kept_response: StoredResponse | None = None
    # Money the exchange cost at ``price`` (the model's price then); None: unpriced.
    cost: float | None = None
    price: dict[str, Any] | None = None
    # The adapter or checkpoint digest last verified for the weights that served it.
    weights_digest: str | None = None


@dataclass(frozen=True)
class FeedbackDraft:
    """Feedback on one or more records of one scenario, or the outcome of a session.

    With ``session_id`` it is the outcome of that session's task: ``record_ids`` is then
    empty or names the one turn it targets (a correction of that turn; the branch through
    it). Learning spreads an outcome over the turns by the recipe's credit policy.
    """

    scenario: str
    record_ids: tuple[str, ...]
    score: float | None
    feedback: Any
    correction: Any
    metadata: dict[str, Any]
    principal: str | None
    idempotency_key: str | None
    # The principal's trust level now (kept with the row: a later change of the key's
    # level does not rewrite what its feedback was worth when it was written).
    trust: Trust = "operator"
    session_id: str | None = None
    # ``explicit`` (posted) or ``signal:<name>`` / ``judge:<name>`` (computed from the
    # traffic, ``reef.learning.computed``), with the computing rule's confidence.
    source: str = EXPLICIT
    confidence: float | None = None


@dataclass(frozen=True)
class FeedbackView:
    """Stored feedback as reads return it.

    ``quarantine_reason`` is set when a learning run's screening quarantined it;
    ``released_at`` when an admin released it. ``quarantined`` feedback is never trained
    on or used as gate evidence.
    """

    id: str
    scenario: str
    record_ids: tuple[str, ...]
    score: float | None
    feedback: Any
    correction: Any
    metadata: dict[str, Any]
    principal: str | None
    idempotency_key: str | None
    created_at: datetime
    trust: Trust = "operator"
    quarantine_reason: str | None = None
    quarantined_at: datetime | None = None
    released_at: datetime | None = None
    released_by: str | None = None
    session_id: str | None = None  # set for the outcome of a session (``FeedbackDraft``)
    source: str = "explicit"
    confidence: float | None = None

    @property
    def quarantined(self) -> bool:
        """Held back by screening and not released."""
        return self.quarantined_at is not None and self.released_at is None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the admin API)."""
        return {
            "id": self.id,
            "scenario": self.scenario,
            "record_ids": list(self.record_ids),
            "session_id": self.session_id,
            "source": self.source,
            "confidence": self.confidence,
            "score": self.score,
            "feedback": self.feedback,
            "correction": self.correction,
            "metadata": self.metadata,
            "principal": self.principal,
            "trust": self.trust,
            "idempotency_key": self.idempotency_key,
            "created_at": self.created_at.isoformat(),
            "quarantined": self.quarantined,
            "quarantine_reason": self.quarantine_reason,
            "quarantined_at": _iso(self.quarantined_at),
            "released_at": _iso(self.released_at),
            "released_by": self.released_by,
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


@dataclass(frozen=True)
class RecordView:
    """A stored record with the feedback attached to it."""

    id: str
    scenario: str
    session_id: str
    turn: int
    release_id: str | None
    api: str
    request: dict[str, Any]
    response: dict[str, Any] | None
    status: RecordStatus
    error: str | None
    latency_ms: float
    usage: dict[str, Any] | None
    prompt_hash: str
    content_hash: str
    tags: dict[str, str]
    principal: str | None
    purpose: Purpose
    created_at: datetime
    feedback: tuple[FeedbackView, ...] = ()
    continuation_hash: str | None = None
    idempotency_key: str | None = None
    rendered_request: dict[str, Any] | None = None
    cost: float | None = None  # money, at ``price``; None: unpriced
    price: dict[str, Any] | None = None
    weights_digest: str | None = None  # last verified for the weights that served it


@dataclass(frozen=True)
class ReleaseTraffic:
    """The live traffic one release served: ``served`` records (purpose ``serve``),
    ``scored`` feedback scores on them and their ``mean_score`` (None without any)."""

    served: int
    scored: int
    mean_score: float | None


@dataclass(frozen=True)
class SessionMatch:
    """The session a request continues, found by its conversation prefix."""

    session_id: str
    record_id: str
    turn: int


@dataclass(frozen=True)
class RecordFilter:
    """Filters for listing a scenario's records."""

    session_id: str | None = None
    has_feedback: bool | None = None
    min_score: float | None = None
    since: datetime | None = None
    purpose: Purpose | None = None
    # ``import:<format>``: records imported from that format (their ``reef.origin`` tag);
    # ``live``: records without one (traffic through the gateway).
    origin: str | None = None


@dataclass(frozen=True)
class RecordPage:
    """One page of records and the cursor for the next (None at the end)."""

    records: tuple[RecordView, ...]
    next_cursor: str | None


def check_feedback_source(source: str, confidence: float | None) -> None:
    """Raise ``InvalidInputError`` unless ``source`` is ``explicit`` (no confidence) or
    ``signal:<name>`` / ``judge:<name>`` with a confidence in [0, 1]."""
    if source == EXPLICIT:
        if confidence is not None:
            raise InvalidInputError("explicit feedback carries no confidence")
        return
    if not _SOURCE.fullmatch(source):
        raise InvalidInputError(
            f"feedback source {source[:80]!r} is neither 'explicit' nor 'signal:<name>' or "
            "'judge:<name>' (lower-case letters, digits, '_', '.', '-', '/')"
        )
    if confidence is None or not 0.0 <= confidence <= 1.0:
        raise InvalidInputError(f"computed feedback ({source}) needs a confidence in [0, 1]")


def source_kind(source: str) -> str:
    """``explicit``, ``signal`` or ``judge``: the part of a source before its name."""
    return source.split(":", 1)[0]


MAX_SOURCE_WEIGHT = 10.0


def check_source_weights(sources: Mapping[str, float]) -> None:
    """Raise ``InvalidInputError`` unless every key names a source (``explicit``,
    ``signal``, ``judge`` or one ``signal:<name>`` / ``judge:<name>``) and every weight
    lies in [0, ``MAX_SOURCE_WEIGHT``]."""
    for name, weight in sources.items():
        if name not in (EXPLICIT, *COMPUTED_KINDS):
            check_feedback_source(name, 1.0)
        if not 0.0 <= weight <= MAX_SOURCE_WEIGHT:
            raise InvalidInputError(
                f"{name}: a source weight lies in [0, {MAX_SOURCE_WEIGHT:g}], got {weight}"
            )


def model_call_draft(
    scenario: str,
    model: str | None,
    messages: list[dict[str, Any]],
    reply: str | None,
    tags: dict[str, str],
    created_at: datetime | None = None,
) -> RecordDraft:
    """A call Reef's own machinery made to a model (a judge's grading, the signal
    extractor's question) as a record of purpose ``judge``, which selection never trains
    on: its conversation, its reply and ``tags`` saying what it judged."""
    request = {"model": model or "", "messages": messages}
    answer = {"role": "assistant", "content": reply}
    return RecordDraft(
        id=new_id(),
        scenario=scenario,
        session_id=new_id(),
        api="openai.chat",
        request=request,
        response={"object": "chat.completion", "choices": [{"message": answer}]},
        status="ok",
        error=None,
        latency_ms=0.0,
        usage=None,
        release_id=None,
        prompt_hash="sha256:" + sha256_hex(canonical_json(messages)),
        content_hash="sha256:" + sha256_hex(canonical_json([request, answer])),
        continuation_hash=None,
        tags=tags,
        purpose="judge",
        created_at=created_at,
    )
