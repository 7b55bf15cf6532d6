"""Experience: records, feedback, sessions and dedup, and the stores behind them.

Owns: the ``ExperienceStore`` contract and its SQL implementation on a ``reef.db.Database``
(SQLite and PostgreSQL through SQLAlchemy Core), group-committed record writing
(``RecordWriter``), redaction of captured text, typed detection and scrubbing of personal
data (``personal_data``: ``<EMAIL>``, ``<PHONE>``, …), export to JSON Lines / Parquet /
OpenAI fine-tuning lines, import from other tools' logs (``importing``),
the live traffic behind each release (the learning curve's half), the stored responses
of the OpenAI Responses API (``ResponseStore``: the conversation state behind
``previous_response_id``), the
idempotency claims by which gateways sharing a store call the upstream once per key
(``IdempotencyClaims``), and trajectories: a session's records assembled into a tree
of turns with their tool calls and results (``trajectories``), on a dialect-free form
of each record (``exchanges``).
Does not own: the SQL schema and its migrations (``db``: one schema, one migration stream
for every store), HTTP or how records are captured (``gateway``), the release chain
(``releases``), learning (``learning``). Must not import gateway, learning, torch, or
another store's package (releases, evaluation, jobs).
Extend: a new backend implements ``ExperienceStore`` (``store.py``); a new dialect of
records registers its canonicaliser in ``exchanges.CANONICALISERS`` and trajectories
follow.
"""

from reef.experience.backends import open_store
from reef.experience.calibration import SourceCalibration, calibrate, calibrate_records
from reef.experience.claims import Claim, IdempotencyClaims
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
from reef.experience.exchanges import (
    TRAINABLE_APIS,
    CanonicalExchange,
    canonical_exchange,
    chat_messages,
)
from reef.experience.export import (
    EXPORT_FORMATS,
    ParquetUnavailableError,
    binary_output,
    export_records,
    export_views,
)
from reef.experience.importing import (
    BATCH_LINES as IMPORT_BATCH_LINES,
)
from reef.experience.importing import (
    IMPORT_FORMATS,
    IMPORT_ORIGIN_PREFIX,
    ORIGIN_TAG,
    SOURCE_TAG,
    ImportLineError,
    ImportOptions,
    ImportReader,
    ImportSummary,
    LineImport,
    UnknownImportFormatError,
    closes_object,
    demo_trust,
    import_file,
    opens_object,
    reader_named,
    sniff_reader,
)
from reef.experience.importing.otel import otlp_attributes
from reef.experience.learning_spend import (
    LEARNING_SPEND,
    LEARNING_SPEND_FILE,
    LearningBudgetExhaustedError,
    LearningMeter,
    SpendTally,
    price_of,
    read_published,
)
from reef.experience.personal_data import (
    SCRUBBED_KINDS,
    PersonalData,
    find_personal_data,
    personal_data_key,
    scrub_personal_text,
    scrub_personal_value,
)
from reef.experience.records import (
    COMPUTED_KINDS,
    EXPLICIT,
    FeedbackDraft,
    FeedbackView,
    Purpose,
    RecordDraft,
    RecordFilter,
    RecordPage,
    RecordStatus,
    RecordView,
    ReleaseTraffic,
    SessionMatch,
    StoredResponse,
    check_feedback_source,
    check_source_weights,
    model_call_draft,
    source_kind,
)
from reef.experience.redaction import REDACTED, Redactor
from reef.experience.responses import ResponseNotFoundError, ResponseStore
from reef.experience.spend import (
    KeySpend,
    Ledger,
    Line,
    MemoryLedger,
    ReleaseSpend,
    SpendRow,
    StoreLedger,
    spend_by_key,
    spend_by_release,
    spend_since,
    window_end,
    window_start,
)
from reef.experience.sql import SQLExperienceStore, experience_holdings
from reef.experience.store import ExperienceStore
from reef.experience.trajectories import Branch, Trajectory, Turn, assemble_trajectory
from reef.experience.writer import RecordWriter, WriterStats

__all__ = [
    "COMPUTED_KINDS",
    "EXPLICIT",
    "EXPORT_FORMATS",
    "IMPORT_BATCH_LINES",
    "IMPORT_FORMATS",
    "IMPORT_ORIGIN_PREFIX",
    "LEARNING_SPEND",
    "LEARNING_SPEND_FILE",
    "ORIGIN_TAG",
    "REDACTED",
    "SCRUBBED_KINDS",
    "SOURCE_TAG",
    "TRAINABLE_APIS",
    "Branch",
    "CanonicalExchange",
    "Claim",
    "ExperienceStore",
    "FeedbackDraft",
    "FeedbackNotFoundError",
    "FeedbackNotQuarantinedError",
    "FeedbackView",
    "IdempotencyClaims",
    "IdempotencyConflictError",
    "ImportLineError",
    "ImportOptions",
    "ImportReader",
    "ImportSummary",
    "KeySpend",
    "LearningBudgetExhaustedError",
    "LearningMeter",
    "Ledger",
    "Line",
    "LineImport",
    "MemoryLedger",
    "ParquetUnavailableError",
    "PersonalData",
    "Purpose",
    "RecordDraft",
    "RecordFilter",
    "RecordNotFoundError",
    "RecordPage",
    "RecordStatus",
    "RecordView",
    "RecordWriter",
    "Redactor",
    "ReleaseSpend",
    "ReleaseTraffic",
    "ResponseNotFoundError",
    "ResponseStore",
    "SQLExperienceStore",
    "SessionMatch",
    "SessionNotFoundError",
    "SourceCalibration",
    "SpendRow",
    "SpendTally",
    "StoreLedger",
    "StoreUnavailableError",
    "StoredResponse",
    "Trajectory",
    "Turn",
    "UnknownImportFormatError",
    "WriterNotRunningError",
    "WriterStats",
    "assemble_trajectory",
    "binary_output",
    "calibrate",
    "calibrate_records",
    "canonical_correction",
    "canonical_exchange",
    "chat_messages",
    "check_correction",
    "check_feedback_source",
    "check_source_weights",
    "closes_object",
    "demo_trust",
    "experience_holdings",
    "export_records",
    "export_views",
    "find_personal_data",
    "import_file",
    "is_tool_call_correction",
    "model_call_draft",
    "open_store",
    "opens_object",
    "otlp_attributes",
    "personal_data_key",
    "price_of",
    "read_published",
    "reader_named",
    "scrub_personal_text",
    "scrub_personal_value",
    "sniff_reader",
    "source_kind",
    "spend_by_key",
    "spend_by_release",
    "spend_since",
    "window_end",
    "window_start",
]
