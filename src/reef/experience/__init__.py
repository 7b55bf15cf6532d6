"""Experience: records, feedback, sessions, dedup and staleness, and the stores behind them.

Owns: the ``ExperienceStore`` contract and its SQL implementation (SQLite and PostgreSQL
through SQLAlchemy Core), the whole SQL schema of DESIGN.md §3 and its Alembic
migrations, group-committed record writing (``RecordWriter``), redaction of captured
text, export to JSON Lines / Parquet, the stored responses of the OpenAI Responses API
(``ResponseStore``: the conversation state behind ``previous_response_id``), and
trajectories: a session's records assembled into a tree of turns with their tool calls
and results (``trajectories``), on a dialect-free form of each record (``exchanges``).
Does not own: HTTP or how records are captured (``gateway``), the release chain's rules
(``releases`` reads and writes its tables, but the schema lives here so one migration
stream covers the database), learning (``learning``). Must not import gateway, learning
or torch.
Extend: a new backend implements ``ExperienceStore`` (``store.py``); a schema change is a
new revision in ``migrations/versions`` plus the same change in ``schema.py`` (a test
compares them); a new dialect of records registers its canonicaliser in
``exchanges.CANONICALISERS`` and trajectories follow.
"""

from reef.experience.backends import open_store
from reef.experience.corrections import (
    canonical_correction,
    check_correction,
    is_tool_call_correction,
)
from reef.experience.errors import (
    FeedbackNotFoundError,
    FeedbackNotQuarantinedError,
    IdempotencyConflictError,
    RecordNotFoundError,
    SessionNotFoundError,
    StoreUnavailableError,
    WriterNotRunningError,
)
from reef.experience.exchanges import TRAINABLE_APIS, CanonicalExchange, canonical_exchange
from reef.experience.export import ParquetUnavailableError, export_records
from reef.experience.records import (
    FeedbackDraft,
    FeedbackView,
    Purpose,
    RecordDraft,
    RecordFilter,
    RecordPage,
    RecordStatus,
    RecordView,
    SessionMatch,
)
from reef.experience.redaction import REDACTED, Redactor
from reef.experience.responses import ResponseNotFoundError, ResponseStore, StoredResponse
from reef.experience.sql import SQLExperienceStore
from reef.experience.store import ExperienceStore
from reef.experience.trajectories import Branch, Trajectory, Turn, assemble_trajectory
from reef.experience.writer import RecordWriter, WriterStats

__all__ = [
    "REDACTED",
    "TRAINABLE_APIS",
    "Branch",
    "CanonicalExchange",
    "ExperienceStore",
    "FeedbackDraft",
    "FeedbackNotFoundError",
    "FeedbackNotQuarantinedError",
    "FeedbackView",
    "IdempotencyConflictError",
    "ParquetUnavailableError",
    "Purpose",
    "RecordDraft",
    "RecordFilter",
    "RecordNotFoundError",
    "RecordPage",
    "RecordStatus",
    "RecordView",
    "RecordWriter",
    "Redactor",
    "ResponseNotFoundError",
    "ResponseStore",
    "SQLExperienceStore",
    "SessionMatch",
    "SessionNotFoundError",
    "StoreUnavailableError",
    "StoredResponse",
    "Trajectory",
    "Turn",
    "WriterNotRunningError",
    "WriterStats",
    "assemble_trajectory",
    "canonical_correction",
    "canonical_exchange",
    "check_correction",
    "export_records",
    "is_tool_call_correction",
    "open_store",
]
