"""The reader contract of ``reef import``: one ``ImportReader`` per source format, each
turning one parsed line into the records and feedback it holds, registered by name.

Where imported rows are marked, and why there is no schema change: a record keeps its
origin (``import:<format>``) and its source id in two tags (``ORIGIN_TAG``,
``SOURCE_TAG``), and is written with the idempotency key ``import:<format>:<source id>``
(``reef`` keeps the record's own id and key). The store already refuses a second record
with the same ``(scenario, idempotency_key)`` (a unique index), so deduplication needs no
new column, index or migration, and a record read back says where it came from. Feedback
is deduplicated the same way through the feedback idempotency key.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from reef.core.errors import InvalidInputError
from reef.core.trust import Trust

ORIGIN_TAG = "reef.origin"
SOURCE_TAG = "reef.source_id"
IMPORT_ORIGIN_PREFIX = "import:"


class ImportLineError(InvalidInputError):
    """One line of an import source could not be read; the message says why."""


@dataclass(frozen=True)
class ImportedRecord:
    """One exchange read from a source line.

    ``session_key`` is the source's conversation / session / thread id (None: the
    session is inferred from the conversation as for live traffic). ``record_id`` and
    ``idempotency_key`` are kept only by the ``reef`` format (its own ids)."""

    source_id: str
    request: dict[str, Any]
    response: dict[str, Any] | None
    api: str = "openai.chat"
    session_key: str | None = None
    created_at: datetime | None = None
    status: str = "ok"
    error: str | None = None
    latency_ms: float = 0.0
    usage: dict[str, Any] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    principal: str | None = None
    purpose: str = "serve"
    record_id: str | None = None
    idempotency_key: str | None = None
    release_id: str | None = None
    hashes: tuple[str, str, str | None] | None = None  # prompt, content, continuation


@dataclass(frozen=True)
class ImportedFeedback:
    """Feedback read from a source line, on records of the same line (``record_indexes``)
    or on records stored earlier: by id (``record_ids``, the ``reef`` format) or by
    the source id they were imported with (``record_sources``, ``otel``).

    ``principal`` / ``trust`` None: the importer's (``import:<format>``, ``--demo-trust``)."""

    source_id: str
    score: float | None
    record_indexes: tuple[int, ...] = ()
    record_ids: tuple[str, ...] = ()
    # Source ids of this format's records, imported on this line or an earlier one (a
    # score row of its own naming the run / observation / inference / span it grades). When
    # one is not found and ``session_id`` is set, the feedback is that session's outcome.
    record_sources: tuple[str, ...] = ()
    feedback: Any = None
    correction: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    principal: str | None = None
    trust: Trust | None = None
    idempotency_key: str | None = None
    session_id: str | None = None  # the outcome of a session (``reef`` format)
    source: str = "explicit"
    confidence: float | None = None


@dataclass(frozen=True)
class ImportItem:
    """What one source line holds."""

    records: tuple[ImportedRecord, ...]
    feedback: tuple[ImportedFeedback, ...] = ()
    # Parts of the line that could not be read while the rest could (one bad span of an
    # OTLP export request): each reported as a skip of the line, or fatal with --strict.
    problems: tuple[str, ...] = ()


class ImportReader(ABC):
    """Reads one source format, line by line (JSON Lines)."""

    name: str

    @abstractmethod
    def sniff(self, line: Any) -> bool:
        """Whether a parsed first line looks like this format (``--format auto``)."""

    @abstractmethod
    def read(self, line: Any) -> ImportItem:
        """The records and feedback of one parsed line; raises ``ImportLineError``
        saying what is wrong with it."""


def as_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; else ``ImportLineError`` naming ``what``."""
    if not isinstance(value, dict):
        raise ImportLineError(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def parse_time(value: Any) -> datetime | None:
    """A timestamp given as ISO 8601 text or Unix seconds; None when absent."""
    if value is None:
        return None
    try:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return datetime.fromtimestamp(value, UTC)
        if isinstance(value, str):
            moment = datetime.fromisoformat(value)
            return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    except (ValueError, OverflowError, OSError) as error:
        raise ImportLineError(f"unreadable timestamp {value!r}: {error}") from error
    raise ImportLineError(f"unreadable timestamp {value!r}")


def assistant_response(
    source_id: str, model: str, message: dict[str, Any], created: datetime | None
) -> dict[str, Any]:
    """A chat completion holding ``message`` as its one choice (readers whose source
    keeps only the answer)."""
    response: dict[str, Any] = {
        "id": f"chatcmpl-import-{source_id}",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
    }
    if created is not None:
        response["created"] = int(created.timestamp())
    return response


def text_of(value: Any) -> str | None:
    """``value`` as text: a string as is, None as None, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def latency_ms(start: datetime | None, end: datetime | None) -> float:
    """Milliseconds from ``start`` to ``end``; 0 when either is unknown."""
    if start is None or end is None:
        return 0.0
    return max(0.0, (end - start).total_seconds() * 1000.0)


def as_score(value: Any, what: str) -> float | None:
    """A score as a float (booleans 1 / 0); None when absent."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, int | float):
        return float(value)
    raise ImportLineError(f"{what} must be a number or a boolean, got {type(value).__name__}")
