"""Feedback screening: what a learning run holds back before anything trains on it.

``screen_feedback`` looks at the feedback of a selection's eligible records and flags,
with one reason each (several reasons are joined):

- ``repeated_correction``: one author gives the same correction to many different
  inputs — at least ``repeated_min`` corrections over as many distinct prompts, one value
  making up ``repeated_share`` of them or more — and the rest of the scenario (other
  authors' corrections and the trusted suites' references) gives that value a share at
  least ``repeated_margin`` lower. Honest labels of a classification task repeat too, but
  about as often as everyone else's do.
- ``contradicts_suite``: a correction for an input that is near-identical (token Jaccard
  at least ``similar_inputs``) to a trusted suite item's, where neither the correction
  nor the item's reference contains the other.
- ``burst``: with at least two authors and ``burst_min`` feedback rows in the batch, one
  author supplies more than ``burst_share`` (default 80%) of them; its newest rows beyond
  that share are flagged. An application's own grader that writes most feedback should
  be given ``operator`` trust in its scenario (``scenarios.<s>.trust``), which exempts it.
- ``planted_instruction``: the feedback text or correction carries a planted instruction
  (``reef.harness.scanning``) or, with ``flag_urls``, a URL.

Feedback whose author's trust is at least ``exempt_trust`` (default ``operator``), and
feedback an admin already released, is not screened. The worker quarantines what is
flagged (kept, never trained on or used as evidence until an admin releases it); this
module only reads.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reef.core.jsoncodec import canonical_json
from reef.core.trust import Trust, at_least
from reef.experience import FeedbackView, RecordView
from reef.harness import scan_value
from reef.learning.learners._similarity import jaccard, tokens
from reef.upstream.canonical import canonical_request

_URL = re.compile(r"https?://[^\s)\"'>]+", re.IGNORECASE)
_SPACE = re.compile(r"\s+")


class ScreeningConfig(BaseModel):
    """The screening rules of a recipe (``selection.screening``; module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    exempt_trust: Trust = "operator"
    repeated_min: int = Field(default=8, ge=2)
    repeated_share: float = Field(default=0.8, gt=0.0, le=1.0)
    repeated_margin: float = Field(default=0.3, ge=0.0, le=1.0)
    similar_inputs: float = Field(default=0.9, gt=0.0, le=1.0)
    burst_min: int = Field(default=20, ge=2)
    burst_share: float = Field(default=0.8, gt=0.0, le=1.0)
    flag_urls: bool = True


@dataclass(frozen=True)
class TrustedReference:
    """An operator suite item's input and reference, for the contradiction rule."""

    key: str
    prompt: str
    reference: str


@dataclass(frozen=True)
class _Row:
    feedback: FeedbackView
    prompt: str
    correction: str | None  # normalized, for comparing
    text: bool  # the correction is text (not a tool call or other structure)


def author_name(principal: str | None) -> str:
    """How an author is named in reasons and evidence (``anonymous`` for no key)."""
    return principal if principal is not None else "anonymous"


def screen_feedback(
    records: Iterable[RecordView],
    config: ScreeningConfig,
    trusted: Sequence[TrustedReference] = (),
) -> dict[str, tuple[str, ...]]:
    """Feedback id -> why it is flagged (one reason per rule that flagged it, each
    ``"<rule>: <what it saw>"``), over the feedback of ``records`` that is not
    quarantined, not released and below ``config.exempt_trust``."""
    if not config.enabled:
        return {}
    everyone, screened = _rows(records, config.exempt_trust)
    reasons: defaultdict[str, list[str]] = defaultdict(list)
    for rule in (_planted, _repeated, _contradicting, _bursts):
        for feedback_id, reason in rule(screened, everyone, config, trusted):
            reasons[feedback_id].append(reason)
    return {feedback_id: tuple(found) for feedback_id, found in sorted(reasons.items())}


def rule_of(reason: str) -> str:
    """The rule name a reason starts with (``repeated_correction``, …)."""
    return reason.split(":", 1)[0]


def _rows(records: Iterable[RecordView], exempt: Trust) -> tuple[list[_Row], list[_Row]]:
    """Every live feedback once (with its first record's prompt), and those screened."""
    seen: dict[str, _Row] = {}
    for record in records:
        for fb in record.feedback:
            if fb.id in seen or fb.quarantined:
                continue
            text = _correction_text(fb.correction)
            normalized = (
                _normalized_text(text)
                if text is not None
                else None
                if fb.correction is None
                else canonical_json(fb.correction).decode()
            )
            seen[fb.id] = _Row(fb, prompt_text(record), normalized, text is not None)
    rows = sorted(seen.values(), key=lambda row: row.feedback.id)
    screened = [
        row
        for row in rows
        if row.feedback.released_at is None and not at_least(row.feedback.trust, exempt)
    ]
    return rows, screened


def prompt_text(record: RecordView) -> str:
    """The text of the record's last user message (what the feedback is about)."""
    messages = canonical_request(record.api, record.request)
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            return str(message["content"])
    return ""


def _normalized_text(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def _correction_text(value: Any) -> str | None:
    """A text correction (a string, or an assistant message with text only)."""
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return None if value.get("tool_calls") else str(value["content"])
    return value if isinstance(value, str) else None


def _shown(value: str, limit: int = 60) -> str:
    return repr(value if len(value) <= limit else value[: limit - 3] + "...")


# -- rules -------------------------------------------------------------------------------


def _planted(
    screened: list[_Row],
    everyone: list[_Row],
    config: ScreeningConfig,
    trusted: Sequence[TrustedReference],
) -> Iterable[tuple[str, str]]:
    for row in screened:
        fb = row.feedback
        findings = scan_value(fb.correction, "correction") + scan_value(fb.feedback, "feedback")
        if config.flag_urls:
            findings += [
                f"{where}: url: {url!r}"
                for where, value in (("correction", fb.correction), ("feedback", fb.feedback))
                for url in _URL.findall(canonical_json(value).decode() if value else "")
            ]
        if findings:
            yield fb.id, f"planted_instruction: {findings[0]}"


def _repeated(
    screened: list[_Row],
    everyone: list[_Row],
    config: ScreeningConfig,
    trusted: Sequence[TrustedReference],
) -> Iterable[tuple[str, str]]:
    by_author: defaultdict[str | None, list[_Row]] = defaultdict(list)
    for row in screened:
        if row.correction is not None:
            by_author[row.feedback.principal].append(row)
    for principal, rows in by_author.items():
        prompts = {_normalized_text(row.prompt) for row in rows}
        if len(rows) < config.repeated_min or len(prompts) < config.repeated_min:
            continue
        value, count = Counter(row.correction or "" for row in rows).most_common(1)[0]
        share = count / len(rows)
        if share < config.repeated_share - 1e-9:
            continue
        others = [
            row.correction
            for row in everyone
            if row.correction is not None and row.feedback.principal != principal
        ] + [_normalized_text(item.reference) for item in trusted]
        baseline = others.count(value) / len(others) if others else 0.0
        if len(others) >= config.repeated_min and share < baseline + config.repeated_margin:
            continue
        reason = (
            f"repeated_correction: {_shown(value)} given for {count} of {len(rows)} "
            f"different inputs by {author_name(principal)!r} (at most "
            f"{config.repeated_share:.0%} allowed, the rest of the scenario: {baseline:.0%})"
        )
        yield from ((row.feedback.id, reason) for row in rows if row.correction == value)


def _contradicting(
    screened: list[_Row],
    everyone: list[_Row],
    config: ScreeningConfig,
    trusted: Sequence[TrustedReference],
) -> Iterable[tuple[str, str]]:
    if not trusted:
        return
    suite = [(tokens(item.prompt), _normalized_text(item.reference), item) for item in trusted]
    for row in screened:
        correction = row.correction
        if correction is None or not row.text:
            continue
        asked = tokens(row.prompt)
        for prompt_tokens, reference, item in suite:
            if jaccard(asked, prompt_tokens) < config.similar_inputs:
                continue
            if reference in correction or correction in reference:
                break
            yield (
                row.feedback.id,
                f"contradicts_suite: the correction {_shown(correction)} contradicts trusted "
                f"item {item.key} (reference {_shown(reference)}) for a near-identical input",
            )
            break


def _bursts(
    screened: list[_Row],
    everyone: list[_Row],
    config: ScreeningConfig,
    trusted: Sequence[TrustedReference],
) -> Iterable[tuple[str, str]]:
    authors = Counter(row.feedback.principal for row in everyone)
    total = len(everyone)
    if len(authors) < 2 or total < config.burst_min:
        return
    allowed = math.floor(config.burst_share * total)
    mine: defaultdict[str | None, list[_Row]] = defaultdict(list)
    for row in screened:
        mine[row.feedback.principal].append(row)
    for principal, rows in mine.items():
        count = authors[principal]
        if count <= allowed:
            continue
        reason = (
            f"burst: {author_name(principal)!r} supplied {count} of {total} feedback rows "
            f"in this batch (at most {config.burst_share:.0%})"
        )
        newest = sorted(rows, key=lambda row: row.feedback.id, reverse=True)
        yield from ((row.feedback.id, reason) for row in newest[: count - allowed])
