"""Errors of the experience store, each refining one ``reef.core.errors`` category."""

from __future__ import annotations

from reef.core.errors import ConflictError, NotFoundError
from reef.db import StoreUnavailableError

__all__ = [
    "FeedbackNotFoundError",
    "FeedbackNotQuarantinedError",
    "IdempotencyConflictError",
    "RecordNotFoundError",
    "SessionNotFoundError",
    "StoreUnavailableError",
    "WriterNotRunningError",
]


class RecordNotFoundError(NotFoundError):
    """No record with this id (in this scenario, where one was named)."""

    def __init__(self, record_id: str, scenario: str | None = None) -> None:
        where = f" in scenario {scenario!r}" if scenario is not None else ""
        super().__init__(f"record {record_id!r} not found{where}")
        self.record_id = record_id
        self.scenario = scenario


class FeedbackNotFoundError(NotFoundError):
    """No feedback with this id."""

    def __init__(self, feedback_id: str) -> None:
        super().__init__(f"feedback {feedback_id!r} not found")
        self.feedback_id = feedback_id


class FeedbackNotQuarantinedError(ConflictError):
    """Only quarantined feedback can be released."""

    def __init__(self, feedback_id: str) -> None:
        super().__init__(f"feedback {feedback_id!r} is not quarantined")
        self.feedback_id = feedback_id


class SessionNotFoundError(NotFoundError):
    """The scenario has no records in this session."""

    def __init__(self, scenario: str, session_id: str) -> None:
        super().__init__(f"session {session_id!r} not found in scenario {scenario!r}")
        self.scenario = scenario
        self.session_id = session_id


class IdempotencyConflictError(ConflictError):
    """An idempotency key was reused with a different body."""

    def __init__(self, scenario: str, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} in scenario {scenario!r} was already used "
            "with a different body"
        )
        self.scenario = scenario
        self.key = key


class WriterNotRunningError(StoreUnavailableError):
    """A record was submitted to a ``RecordWriter`` that is not started or already closed."""
