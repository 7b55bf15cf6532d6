"""``Redactor``: scrub configured patterns from captured requests and responses."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from reef.core.errors import InvalidInputError
from reef.experience.records import RecordDraft

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
        """``draft`` with its request, response and error redacted (hashes untouched)."""
        if not self._patterns:
            return draft
        return dataclasses.replace(
            draft,
            request=self._walk(draft.request),
            response=self._walk(draft.response),
            error=None if draft.error is None else self.redact_text(draft.error),
        )

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            return {key: self._walk(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return [self._walk(item) for item in value]
        return value
