"""``Redactor``: scrub configured patterns from every string Reef stores or exports.

What it covers: a record's request, rendered request, response, error and tag values;
the stored Responses-API state that travels with it (input items and response); the
text, correction and metadata of feedback; and every record and feedback row that
``reef export`` writes (redacted again with the patterns configured at export time, so
rows written before a pattern was added leave scrubbed too). What it leaves alone:
mapping keys (structure, not content), ids, session ids, scenario and key names,
idempotency keys and hashes (identifiers Reef looks things up by).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from reef.core.errors import InvalidInputError
from reef.experience.records import (
    FeedbackDraft,
    FeedbackView,
    RecordDraft,
    RecordView,
    StoredResponse,
)

REDACTED = "[REDACTED]"


class Redactor:
    """Replaces every match of any pattern in every string of a JSON-like value.

    Keys of mappings are left alone (they are structure, not content). Patterns without
    groups are joined into one alternation so a replacement is never re-matched by a
    later pattern; patterns with groups (whose backreferences would shift) or global
    flags run one after another.
    """

    def __init__(self, patterns: Sequence[str]) -> None:
        try:
            compiled = [re.compile(pattern) for pattern in patterns]
        except re.error as error:
            raise InvalidInputError(f"invalid redaction pattern: {error}") from error
        self._patterns = compiled
        if len(compiled) > 1 and not any(p.groups for p in compiled):
            try:
                joined = "|".join(f"(?:{p.pattern})" for p in compiled)
                self._patterns = [re.compile(joined)]
            except re.error:  # e.g. a global flag such as (?i) that must lead the pattern
                pass

    @property
    def active(self) -> bool:
        """Whether there is anything to redact."""
        return bool(self._patterns)

    def redact(self, value: Any) -> Any:
        """A redacted copy of ``value``; with no patterns, ``value`` itself."""
        if not self._patterns:
            return value
        return self._walk(value)

    def redact_text(self, text: str) -> str:
        """``text`` with every match replaced."""
        for pattern in self._patterns:
            text = pattern.sub(REDACTED, text)
        return text

    def redact_draft(self, draft: RecordDraft) -> RecordDraft:
        """``draft`` with its request, rendered request, response, error, tag values and
        kept response redacted (ids and hashes untouched)."""
        if not self._patterns:
            return draft
        return dataclasses.replace(
            draft,
            request=self._walk(draft.request),
            rendered_request=self._walk(draft.rendered_request),
            response=self._walk(draft.response),
            error=self._walk(draft.error),
            tags=self._walk(draft.tags),
            kept_response=(
                None
                if draft.kept_response is None
                else self.redact_stored_response(draft.kept_response)
            ),
        )

    def redact_stored_response(self, stored: StoredResponse) -> StoredResponse:
        """``stored`` with its input items and response object redacted."""
        if not self._patterns:
            return stored
        return dataclasses.replace(
            stored, input_items=self._walk(stored.input_items), response=self._walk(stored.response)
        )

    def redact_feedback(self, draft: FeedbackDraft) -> FeedbackDraft:
        """``draft`` with its feedback, correction and metadata redacted."""
        if not self._patterns:
            return draft
        return dataclasses.replace(
            draft,
            feedback=self._walk(draft.feedback),
            correction=self._walk(draft.correction),
            metadata=self._walk(draft.metadata),
        )

    def redact_view(self, view: RecordView) -> RecordView:
        """A stored record as an export writes it: its content and its feedback's
        redacted like a draft's."""
        if not self._patterns:
            return view
        return dataclasses.replace(
            view,
            request=self._walk(view.request),
            rendered_request=self._walk(view.rendered_request),
            response=self._walk(view.response),
            error=self._walk(view.error),
            tags=self._walk(view.tags),
            feedback=tuple(self._feedback_view(item) for item in view.feedback),
        )

    def redact_feedback_view(self, view: FeedbackView) -> FeedbackView:
        """A stored feedback row as an export writes it: its feedback, correction and
        metadata redacted."""
        if not self._patterns:
            return view
        return self._feedback_view(view)

    def _feedback_view(self, view: FeedbackView) -> FeedbackView:
        return dataclasses.replace(
            view,
            feedback=self._walk(view.feedback),
            correction=self._walk(view.correction),
            metadata=self._walk(view.metadata),
        )

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            return {key: self._walk(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(item) for item in value]
        return value
