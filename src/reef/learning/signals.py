"""Conversation signals: feedback computed from the traffic itself, no grader needed.

An agent's conversation says how its last answer went. ``session_signals`` reads one
session's trajectory (``reef.experience.trajectories``: canonical turns, both dialects
alike) and finds, for a turn's answer, what came next:

- ``correction``: the user's next message says the answer was wrong, in any of the ways
  ``reef.learning.follow_ups`` reads ("no, that's wrong", "hmm, I think it's actually
  X", "you mixed up …", "my order number is X", or X alone); score 0, and the right value
  the message gives (a copula or obligation, "X, not Y", quotes or code, the one span of
  the answer's shape) is the correction;
- ``accept``: the next message thanks or accepts ("thanks", "perfect", "that works");
  score 1 (a message that also complains is a ``correction``, never an ``accept``);
- ``rephrase``: the next message asks the previous question again in other words
  (word overlap at least ``rephrase_similarity``); score 0;
- ``retry``: the same request was sent again after it had been answered; score 0 for
  the answer that was retried (retries after an error say nothing of an answer);
- ``tool_error``: a tool result sent back for the answer's tool call reports an error
  (an ``error`` key, or text opening with "error", "exception", "traceback", …); score
  0, its evidence the tool's message;
- ``abandon`` (only with ``abandon_after_seconds``): the session ended on this answer —
  no later turn, none for that long — and nothing accepted it; score 0, low confidence.

Each ``Signal`` names the record it judges (the answer's record), its score in [0, 1], a
confidence (a prior per rule, ``confidence`` overrides; calibration against explicit
feedback measures the real one) and the evidence it read. Rules are English phrase
patterns (with French, German and Spanish forms) by default; every list is configurable
per scenario (``SignalsConfig``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from reef.experience import Trajectory, Turn
from reef.learning.follow_up_phrases import (
    DEFAULT_ACCEPTS,
    DEFAULT_COMPLAINTS,
    DEFAULT_CORRECTIONS,
)
from reef.learning.follow_ups import PhraseRules, read_follow_up

SignalName = Literal["correction", "accept", "rephrase", "retry", "tool_error", "abandon"]
SIGNAL_NAMES: tuple[SignalName, ...] = (
    "correction",
    "accept",
    "rephrase",
    "retry",
    "tool_error",
    "abandon",
)

DEFAULT_TOOL_ERRORS = (
    r"^\W*(error|exception|traceback|failed|failure|fatal|denied|forbidden|not found|"
    r"invalid|timeout|timed out)\b",
)
DEFAULT_CONFIDENCE: dict[SignalName, float] = {
    "correction": 0.7,
    "accept": 0.6,
    "rephrase": 0.5,
    "retry": 0.5,
    "tool_error": 0.8,
    "abandon": 0.3,
}


class ExtractorConfig(BaseModel):
    """The optional model extractor (``reef.learning.extractor``): where the rules hear a
    complaint but no value, a model reads the exchange and answers the corrected value as
    JSON. ``upstream`` / ``model``: a configured upstream and a model name (default: the
    scenario's own); past ``max_calls_per_hour`` calls in the last hour it waits for the
    next pass; ``confidence``: what its rows (``signal:correction/model``) carry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    upstream: str | None = None
    model: str | None = None
    max_calls_per_hour: int = Field(default=60, ge=1)
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)


class SignalsConfig(BaseModel):
    """Which conversation signals a scenario computes, and the rules behind them.

    A pattern list left unset keeps the English defaults above; a list given replaces
    them (case-insensitive Python regular expressions; ``correction_patterns`` need a
    ``(?P<correction>…)`` group). ``lookback_hours``: how far back a worker's first pass
    looks for sessions (later passes take what arrived since). ``extractor``: the
    optional model extractor for complaints the rules find no value in (None: off).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: tuple[SignalName, ...] = ("correction", "accept", "rephrase", "retry", "tool_error")
    complaint_patterns: tuple[str, ...] = DEFAULT_COMPLAINTS
    accept_patterns: tuple[str, ...] = DEFAULT_ACCEPTS
    correction_patterns: tuple[str, ...] = DEFAULT_CORRECTIONS
    tool_error_patterns: tuple[str, ...] = DEFAULT_TOOL_ERRORS
    rephrase_similarity: float = Field(default=0.6, gt=0.0, le=1.0)
    abandon_after_seconds: float | None = Field(default=None, gt=0.0)
    lookback_hours: float = Field(default=24.0, gt=0.0)
    confidence: dict[SignalName, float] = Field(default_factory=dict)
    extractor: ExtractorConfig | None = None

    @field_validator(
        "complaint_patterns", "accept_patterns", "correction_patterns", "tool_error_patterns"
    )
    @classmethod
    def _compiles(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from exc
        return patterns

    @field_validator("correction_patterns")
    @classmethod
    def _names_the_correction(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            if "correction" not in re.compile(pattern).groupindex:
                raise ValueError(f"pattern {pattern!r} has no (?P<correction>...) group")
        return patterns

    @field_validator("confidence")
    @classmethod
    def _in_unit_range(cls, values: dict[SignalName, float]) -> dict[SignalName, float]:
        for name, value in values.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"confidence of {name!r} must lie in [0, 1], got {value}")
        return values

    def confidence_of(self, name: SignalName) -> float:
        """The confidence a signal of ``name`` carries."""
        return self.confidence.get(name, DEFAULT_CONFIDENCE[name])


@dataclass(frozen=True)
class Signal:
    """What the conversation said about one answer (module doc)."""

    name: SignalName
    record_id: str
    score: float
    confidence: float
    evidence: str
    correction: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "record_id": self.record_id,
            "score": self.score,
            "confidence": self.confidence,
            "evidence": self.evidence,
            "correction": self.correction,
        }


class _Rules:
    """A config's patterns, compiled once."""

    def __init__(self, config: SignalsConfig, vocabulary: Collection[str] = ()) -> None:
        def compiled(patterns: Sequence[str]) -> list[re.Pattern[str]]:
            return [re.compile(p, re.IGNORECASE) for p in patterns]

        self.config = config
        self.vocabulary = tuple(vocabulary)
        self.phrases = PhraseRules.compile(
            config.complaint_patterns, config.accept_patterns, config.correction_patterns
        )
        self.tool_errors = compiled(config.tool_error_patterns)

    def on(self, name: SignalName) -> bool:
        return name in self.config.enabled

    def signal(
        self, name: SignalName, record_id: str, score: float, evidence: str, **more: Any
    ) -> Signal:
        confidence = self.config.confidence_of(name)
        return Signal(name, record_id, score, confidence, evidence[:500], **more)


def session_signals(
    trajectory: Trajectory,
    config: SignalsConfig,
    now: datetime | None = None,
    vocabulary: Collection[str] = (),
) -> list[Signal]:
    """Every signal the session's conversation gives about its answers, at most one of
    each kind per answer, in turn order. ``now`` (aware) decides ``abandon``;
    ``vocabulary``: the scenario's labels (``observed_vocabulary``), which let a label
    answer's correction be heard like a value's."""
    rules = _Rules(config, vocabulary)
    found: list[Signal] = []
    for turn in trajectory.turns.values():
        found.extend(_retried(turn, rules))
        parent = trajectory.turns.get(turn.parent) if turn.parent is not None else None
        if parent is None or turn.parent_record_id is None:
            continue
        found.extend(_next_turn(parent, turn, turn.parent_record_id, rules))
    if rules.on("abandon") and now is not None:
        found.extend(_abandoned(trajectory, found, rules, now))
    seen: set[tuple[str, str]] = set()
    unique = []
    for signal in found:
        if (signal.name, signal.record_id) not in seen:
            seen.add((signal.name, signal.record_id))
            unique.append(signal)
    return unique


def _next_turn(parent: Turn, turn: Turn, record_id: str, rules: _Rules) -> Iterator[Signal]:
    """What ``turn``'s new messages say about the answer (``record_id``) it continues."""
    said = " ".join(_text(m) for m in turn.new_messages if m.get("role") == "user").strip()
    if rules.on("tool_error"):
        for result in turn.tool_results:
            message = _tool_error(result, rules)
            if message is not None:
                yield rules.signal("tool_error", record_id, 0.0, message)
                break
    if not said:
        return
    reading = read_follow_up(
        said,
        answer=_answer_text(parent, record_id),
        question=_last_user_text(parent.messages),
        rules=rules.phrases,
        vocabulary=rules.vocabulary,
        rephrase_similarity=rules.config.rephrase_similarity,
    )
    if reading.complaint and rules.on("correction"):
        yield rules.signal("correction", record_id, 0.0, said, correction=reading.correction)
    elif reading.accept and rules.on("accept"):
        yield rules.signal("accept", record_id, 1.0, said)
    if reading.rephrase and rules.on("rephrase"):
        yield rules.signal("rephrase", record_id, 0.0, said)


def _answer_text(parent: Turn, record_id: str) -> str:
    """The text of the answer the user saw (the attempt ``record_id`` of ``parent``)."""
    for attempt in parent.attempts:
        if attempt.record_id == record_id and attempt.reply is not None:
            return _text(attempt.reply)
    return ""


def observed_vocabulary(trajectories: Iterable[Trajectory], most: int = 50) -> tuple[str, ...]:
    """The labels a scenario answers with: answers of at most three words, no digits,
    given at least twice across ``trajectories``, the ``most`` commonest."""
    seen: Counter[str] = Counter()
    for trajectory in trajectories:
        for turn in trajectory.turns.values():
            for attempt in turn.attempts:
                text = _text(attempt.reply or {}).strip().strip(".!")
                short = 0 < len(text) <= 30 and len(text.split()) <= 3
                if short and not any(c.isdigit() for c in text):
                    seen[text] += 1
    return tuple(label for label, count in seen.most_common(most) if count >= 2)


def _retried(turn: Turn, rules: _Rules) -> Iterator[Signal]:
    """Answers of ``turn`` that the same request was sent again after."""
    if not rules.on("retry"):
        return
    for attempt in turn.attempts[:-1]:
        if attempt.status == "ok":
            yield rules.signal("retry", attempt.record_id, 0.0, "the same request was sent again")


def _abandoned(
    trajectory: Trajectory, found: Sequence[Signal], rules: _Rules, now: datetime
) -> Iterator[Signal]:
    wait = rules.config.abandon_after_seconds
    accepted = {s.record_id for s in found if s.name == "accept"}
    for branch in trajectory.branches:
        turn = trajectory.turns[branch.turns[-1]]
        if turn.children or wait is None:
            continue
        last = turn.answered
        idle = (now - last.created_at).total_seconds()
        if last.status == "ok" and idle >= wait and last.record_id not in accepted:
            evidence = f"no later turn for {idle:.0f} s after this answer"
            yield rules.signal("abandon", last.record_id, 0.0, evidence)


def _tool_error(result: dict[str, Any], rules: _Rules) -> str | None:
    """The error a tool result reports, else None."""
    content = result.get("content")
    text = _text({"content": content}).strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict) and value.get("error"):
            return text
    # An Anthropic tool_result with is_error reads "[error] ..." in canonical form.
    return text if any(p.search(text) for p in rules.tool_errors) else None


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text(message)
    return ""
