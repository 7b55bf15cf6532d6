"""The values the evaluation package passes around: items, answers, scores, decisions.

Frozen dataclasses; ``as_dict()`` gives the JSON-ready form stored as evidence and
printed in reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from reef.core.trust import Trust, parse_trust

Arm = Literal["candidate", "baseline"]
ARMS: tuple[Arm, Arm] = ("candidate", "baseline")
Verdict = Literal["passed", "rejected", "undecided"]
ErrorKind = Literal[
    "refused", "rate_limited", "upstream_error", "timeout", "unreachable", "unreadable"
]
"""Why an answer never came. ``refused``: a 4xx for that item (from the gateway or the
upstream behind it), which the same request meets again; ``rate_limited``: 429;
``upstream_error``: a 5xx; ``timeout``: no reply in time; ``unreachable``: no connection;
``unreadable``: a 200 whose body is no completion."""
TRANSIENT_ERROR_KINDS: frozenset[ErrorKind] = frozenset(
    {"rate_limited", "upstream_error", "timeout", "unreachable"}
)
"""The kinds a later try may not meet: a failure of only these kinds is an outage."""
VOID_ERROR_KINDS: frozenset[str] = frozenset(
    {*TRANSIENT_ERROR_KINDS, "unreadable", "environment", "judge"}
)
"""Failures of the infrastructure, not of the model: an item that met one on either arm
is void for both (counted and reported, never scored). ``environment``: an episode's
environment or sandbox failed; ``judge``: the judge scoring the answer could not be
asked. A ``refused`` item (a 4xx the same request meets again) still scores 0."""


def item_label(key: str) -> str:
    """How messages name the item of ``key`` (``<suite>/<id>``): ``item <id> (<suite>)``;
    a held-out item's id is its record id."""
    suite, _, item_id = key.partition("/")
    return f"item {item_id} ({suite})" if item_id else f"item {key}"


def error_kind_of_status(status: int) -> ErrorKind:
    """The kind of a failed call answered with HTTP ``status`` (not 200): 429
    ``rate_limited``, 5xx ``upstream_error``, any other ``refused``."""
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "upstream_error"
    return "refused"


@dataclass(frozen=True)
class Provenance:
    """Where an item's reference came from: ``source`` (``file`` for an operator's suite,
    ``holdout`` for held-out feedback, ``probe`` for safety probes), the trust level of its
    least trusted author, and its authors (key ids; ``anonymous`` for feedback given with
    no key). Items without one are the operator's (file suites)."""

    source: str
    trust: Trust = "operator"
    authors: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"source": self.source, "trust": self.trust, "authors": list(self.authors)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Provenance:
        """The inverse of ``as_dict``."""
        return cls(
            source=str(data.get("source", "file")),
            trust=parse_trust(data.get("trust", "operator"), "item provenance"),
            authors=tuple(str(author) for author in data.get("authors") or ()),
        )


OPERATOR_FILE = Provenance("file")


@dataclass(frozen=True)
class EvalItem:
    """One thing to ask both arms.

    ``id`` is unique within ``suite`` (suites: ``file:<name>``, ``holdout``,
    ``regression:<release id>``, ``safety:<probe>``). ``messages`` are OpenAI chat
    messages; ``reference`` what a right answer looks like (the scorer decides how it is
    compared; None for scorers that need none); ``scorer`` a scorer spec
    (``{"type": "exact", ...}``) overriding the suite's default; ``params`` extra request
    fields (``max_tokens``, ``temperature``) overriding the gate's.
    """

    id: str
    suite: str
    messages: list[dict[str, Any]]
    reference: Any = None
    scorer: dict[str, Any] | None = None
    tags: tuple[str, ...] = ()
    params: dict[str, Any] = field(default_factory=dict)
    provenance: Provenance = OPERATOR_FILE

    @property
    def key(self) -> str:
        """``<suite>/<id>``: unique across the suites of one evaluation."""
        return f"{self.suite}/{self.id}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (what a regression suite stores)."""
        return {
            "id": self.id,
            "suite": self.suite,
            "messages": self.messages,
            "reference": self.reference,
            "scorer": self.scorer,
            "tags": list(self.tags),
            "params": self.params,
            "provenance": self.provenance.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalItem:
        """The inverse of ``as_dict``."""
        return cls(
            id=str(data["id"]),
            suite=str(data["suite"]),
            messages=list(data["messages"]),
            reference=data.get("reference"),
            scorer=data.get("scorer"),
            tags=tuple(data.get("tags") or ()),
            params=dict(data.get("params") or {}),
            provenance=Provenance.from_dict(data.get("provenance") or {}),
        )


@dataclass(frozen=True)
class ScoreResult:
    """A scorer's verdict on one answer: ``score`` in [0, 1] and what it saw."""

    score: float
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise ValueError(f"a score must lie in [0, 1], got {self.score}")


@dataclass(frozen=True)
class Reply:
    """An arm's reply as a scorer sees it: ``text`` is what text scorers compare (the
    content, then the tool calls as one JSON line), ``content`` the text alone and
    ``tool_calls`` the calls in OpenAI form (``{"id", "type": "function", "function":
    {"name", "arguments"}}``)."""

    text: str
    content: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Answer:
    """What one arm said to one item on one repeat, as the gateway returned it.

    ``text`` is the reply's text (None on error), ``content`` and ``tool_calls`` its
    parts (``Reply``); ``record_id`` the gateway's receipt (the eval record); ``error``
    why no answer came after the retries and ``error_kind`` what kind of failure that was
    (``ErrorKind``; None when an answer came).
    """

    item_key: str
    arm: Arm
    repeat: int
    text: str | None
    record_id: str | None
    error: str | None
    latency_ms: float
    attempts: int = 1
    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    error_kind: ErrorKind | None = None

    @property
    def reply(self) -> Reply | None:
        """The reply a scorer scores; None when no answer came."""
        if self.text is None:
            return None
        content = self.text if self.content is None else self.content
        return Reply(self.text, content, self.tool_calls)


@dataclass(frozen=True)
class ItemResult:
    """One scored answer: the per-item row an evaluation stores."""

    item_key: str
    suite: str
    arm: Arm
    repeat: int
    score: float
    output: str | None
    record_id: str | None
    error: str | None
    details: dict[str, Any] = field(default_factory=dict)
    latency_ms: float = 0.0

    @property
    def void(self) -> bool:
        """Whether infrastructure failed this answer (``details["void"]``): the item is
        then void for both arms (``VOID_ERROR_KINDS``)."""
        return bool(self.details.get("void"))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "item": self.item_key,
            "suite": self.suite,
            "arm": self.arm,
            "repeat": self.repeat,
            "score": self.score,
            "output": self.output,
            "record_id": self.record_id,
            "error": self.error,
            "details": self.details,
            "latency_ms": self.latency_ms,
        }


@dataclass(frozen=True)
class Interval:
    """A mean difference with its bootstrap confidence interval."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "confidence": self.confidence,
        }


@dataclass(frozen=True)
class SuiteSummary:
    """Both arms on one suite: means over items (each item's mean over repeats) and the
    paired difference candidate - baseline with its interval."""

    suite: str
    items: int
    candidate_mean: float
    baseline_mean: float
    difference: Interval

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "suite": self.suite,
            "items": self.items,
            "candidate_mean": self.candidate_mean,
            "baseline_mean": self.baseline_mean,
            "difference": self.difference.as_dict(),
        }


@dataclass(frozen=True)
class Decision:
    """The gate's answer. ``reasons`` says why, one line per rule that decided (for a
    pass: the evidence that it cleared every rule); ``rule`` the thresholds applied."""

    verdict: Verdict
    reasons: list[str]
    rule: dict[str, Any]
    overall: SuiteSummary | None
    suites: list[SuiteSummary]
    safety: list[str] = field(default_factory=list)
    # Where the evidence came from and how the independence rule judged it
    # (``reef.evaluation.provenance``): sources, authors, leave-one-author-out.
    evidence: dict[str, Any] = field(default_factory=dict)
    # Void items (infrastructure failures, never scored): counts by suite and kind.
    voids: dict[str, Any] = field(default_factory=dict)
    # Each protected slice (``gate.protect``): its tag, items, means, change and limit.
    slices: list[dict[str, Any]] = field(default_factory=list)
    # For an undecided verdict: what evidence would let the gate decide.
    missing: list[str] = field(default_factory=list)
    # The method that decided (``sequential`` or ``bootstrap``) and its figures.
    method: dict[str, Any] = field(default_factory=dict)
    # What each arm's answers took: ``{"candidate": {...}, "baseline": {...}}`` with
    # ``answers``, ``latency_ms_mean`` and, where the answers' records are priced,
    # ``cost`` (money) over ``priced`` of them (``decision.arm_figures``).
    arms: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether the candidate may be published."""
        return self.verdict == "passed"

    @property
    def undecided(self) -> bool:
        """Whether the evidence does not decide yet (the candidate waits for more)."""
        return self.verdict == "undecided"

    def summary(self) -> str:
        """One line: ``passed: …``, ``rejected: …`` or ``undecided: …``."""
        return f"{self.verdict}: {'; '.join(self.reasons)}"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "verdict": self.verdict,
            "summary": self.summary(),
            "reasons": self.reasons,
            "rule": self.rule,
            "overall": None if self.overall is None else self.overall.as_dict(),
            "suites": [s.as_dict() for s in self.suites],
            "safety": self.safety,
            "evidence": self.evidence,
            "voids": self.voids,
            "slices": self.slices,
            "missing": self.missing,
            "method": self.method,
            "arms": self.arms,
        }


@dataclass(frozen=True)
class EvidenceNotes:
    """What the caller of the gate knows of the evidence around its items: ``dropped``
    says why held-out records gave no item (one clause, e.g. "12 held-out records had a
    complaint but no corrected value"), added to an insufficient-evidence reason so the
    rejection says what was thrown away; ``details`` go into the decision's ``evidence``
    as they are (e.g. ``suite_overlap``: training records that matched the suites)."""

    dropped: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


INSUFFICIENT_EVIDENCE = "insufficient evidence:"


def with_notes(decision: Decision, notes: EvidenceNotes | None) -> Decision:
    """``decision`` with ``notes``: ``dropped`` after its insufficient-evidence reason,
    ``details`` in its ``evidence``."""
    if notes is None:
        return decision
    reasons = [
        f"{reason} ({notes.dropped})"
        if notes.dropped and reason.startswith(INSUFFICIENT_EVIDENCE)
        else reason
        for reason in decision.reasons
    ]
    return replace(decision, reasons=reasons, evidence={**decision.evidence, **notes.details})
