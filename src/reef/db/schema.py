"""The SQL schema of DESIGN.md §3, one ``MetaData`` for SQLite and PostgreSQL.

JSON values are stored as text written by ``reef.core.dumps`` (orjson) in ``*_json``
columns: both backends then hold byte-identical documents, and neither needs a JSON type.
Timestamps are UTC; ``UTCDateTime`` makes them timezone-aware on read on both backends.

The Alembic migrations under ``migrations/versions`` create exactly these tables; a test
compares the migrated database against this ``MetaData`` so the two cannot drift.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

# Explicit names keep constraint names identical across backends and migrations.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

ID = String(64)  # UUIDv7s are 36 characters; the slack is for ids minted elsewhere
# Client-supplied strings (scenario names, session ids, keys) have no length limit to break.
NAME = Text
HASH = String(100)  # "sha256:" + 64 hex digits fits, with room for other algorithms


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and read back timezone-aware.

    SQLite has no timezone type: values are stored naive in UTC as fixed-width text, so
    they sort and compare correctly as strings. A naive value given to the database is
    taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


scenarios = Table(
    "scenarios",
    metadata,
    Column("name", NAME, primary_key=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("config_json", Text, nullable=True),
)

records = Table(
    "records",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, ForeignKey("scenarios.name"), nullable=False),
    Column("session_id", Text, nullable=False),
    Column("turn", Integer, nullable=False),
    Column("release_id", ID, nullable=True),
    Column("api", String(40), nullable=False),
    Column("request_json", Text, nullable=False),
    Column("rendered_request_json", Text, nullable=True),
    Column("response_json", Text, nullable=True),
    Column("status", String(20), nullable=False),
    Column("error", Text, nullable=True),
    Column("latency_ms", Float, nullable=False),
    Column("usage_json", Text, nullable=True),
    # Money, from usage and the model's price (null: unpriced); the price it used.
    Column("cost", Float, nullable=True),
    Column("price_json", Text, nullable=True),
    # the adapter or checkpoint digest last verified for the weights that served it
    Column("weights_digest", Text, nullable=True),
    Column("prompt_hash", HASH, nullable=False),
    Column("content_hash", HASH, nullable=False),
    Column("continuation_hash", HASH, nullable=True),
    Column("tags_json", Text, nullable=False),
    Column("principal", Text, nullable=True),
    Column("purpose", String(20), nullable=False),
    Column("idempotency_key", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    # Listing is newest first per scenario with (created_at, id) keyset cursors.
    Index(None, "scenario", "created_at", "id"),
    Index(None, "scenario", "session_id", "turn"),
    # find_session: the newest record with a continuation hash, via an index scan.
    Index(None, "scenario", "continuation_hash", "created_at", "id"),
    # NULL keys are distinct on both backends, so only real keys are unique.
    Index(None, "scenario", "idempotency_key", unique=True),
)

feedback = Table(
    "feedback",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, ForeignKey("scenarios.name"), nullable=False),
    Column("score", Float, nullable=True),
    Column("feedback_json", Text, nullable=True),
    Column("correction_json", Text, nullable=True),
    Column("metadata_json", Text, nullable=False),
    Column("principal", Text, nullable=True),
    # The principal's trust level when the feedback was written (0006).
    Column("trust", String(20), nullable=False),
    Column("idempotency_key", Text, nullable=True),
    # Canonical digest of the body, compared when an idempotency key is reused.
    Column("body_hash", HASH, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    # Quarantined by a learning run's screening; released by an admin (0006).
    Column("quarantine_reason", Text, nullable=True),
    Column("quarantined_at", UTCDateTime(), nullable=True),
    Column("released_at", UTCDateTime(), nullable=True),
    Column("released_by", Text, nullable=True),
    # The session whose task outcome this is (0008); None for feedback on records only.
    Column("session_id", Text, nullable=True),
    # Where it came from (0009): explicit (posted), signal:<name> or judge:<name>
    # (computed from the traffic), with the computing rule's confidence.
    Column("source", String(80), nullable=False, server_default="explicit"),
    Column("confidence", Float, nullable=True),
    UniqueConstraint("scenario", "idempotency_key"),
    Index(None, "scenario", "created_at"),
    Index(None, "scenario", "quarantined_at"),
    Index(None, "scenario", "session_id"),
)

feedback_refs = Table(
    "feedback_refs",
    metadata,
    Column("feedback_id", ID, ForeignKey("feedback.id"), nullable=False),
    Column("record_id", ID, ForeignKey("records.id"), nullable=False),
    # Keeps record_ids in the order the client sent them.
    Column("position", Integer, nullable=False),
    PrimaryKeyConstraint("feedback_id", "record_id"),
    Index(None, "record_id"),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("digest", HASH, primary_key=True),
    Column("kind", String(40), nullable=False),
    Column("uri", Text, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("meta_json", Text, nullable=True),
)

candidates = Table(
    "candidates",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, nullable=False),
    Column("parent_release_id", ID, nullable=True),
    Column("manifest_json", Text, nullable=False),
    Column("state", String(20), nullable=False),
    Column("eval_json", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    # Added in 0002; nullable because 0001 rows may predate them. The chain always sets them.
    Column("created_by", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Column("updated_at", UTCDateTime(), nullable=True),
    Index(None, "scenario", "created_at"),
    Index(None, "scenario", "state"),
)

releases = Table(
    "releases",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("parent_id", ID, nullable=True),
    Column("operation", String(20), nullable=False),
    Column("manifest_json", Text, nullable=False),
    Column("eval_json", Text, nullable=True),
    Column("created_by", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("reason", Text, nullable=True),
    # The candidate a publish or promote consumed; the release a rollback restored.
    Column("candidate_id", ID, nullable=True),
    Column("rolled_back_to", ID, nullable=True),
    # The chain is ordered by seq; two writers racing for the same seq: one loses.
    UniqueConstraint("scenario", "seq"),
)

heads = Table(
    "heads",
    metadata,
    Column("scenario", NAME, primary_key=True),
    Column("release_id", ID, nullable=False),
    Column("seq", Integer, nullable=False),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("state", String(20), nullable=False),
    Column("lease_owner", Text, nullable=True),
    Column("lease_until", UTCDateTime(), nullable=True),
    Column("attempt", Integer, nullable=False),
    Column("input_json", Text, nullable=True),
    Column("result_json", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    # Added in 0004: what a running job reports, and the candidate it proposed.
    Column("progress", Float, nullable=True),
    Column("message", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("logs_json", Text, nullable=True),
    Column("metrics_json", Text, nullable=True),
    Column("candidate_id", ID, nullable=True),
    # Claiming scans runnable jobs by state and lease expiry.
    Index(None, "state", "lease_until"),
    Index(None, "scenario", "created_at"),
    # "Is a job of this scenario queued or running?" on every enqueue.
    Index(None, "scenario", "state"),
)

consumed = Table(
    "consumed",
    metadata,
    Column("record_id", ID, nullable=False),
    Column("job_id", ID, nullable=False),
    PrimaryKeyConstraint("record_id", "job_id"),
    Index(None, "job_id"),
)

# Added in 0005: the evaluation gate's runs and their per-item results.
evaluations = Table(
    "evaluations",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, nullable=False),
    # What was compared: a candidate (or release) against a baseline release.
    Column("candidate_id", ID, nullable=False),
    Column("baseline_id", ID, nullable=False),
    Column("state", String(20), nullable=False),  # running | done | failed
    Column("verdict", String(20), nullable=True),  # passed | rejected
    Column("decision_json", Text, nullable=True),
    Column("meta_json", Text, nullable=True),
    Column("created_by", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("finished_at", UTCDateTime(), nullable=True),
    Index(None, "scenario", "created_at"),
    Index(None, "candidate_id"),
)

eval_results = Table(
    "eval_results",
    metadata,
    Column("evaluation_id", ID, nullable=False),
    Column("item_key", Text, nullable=False),
    Column("arm", String(20), nullable=False),
    Column("repeat", Integer, nullable=False),
    Column("suite", Text, nullable=False),
    Column("score", Float, nullable=False),
    Column("record_id", ID, nullable=True),
    Column("output", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("details_json", Text, nullable=True),
    Column("latency_ms", Float, nullable=True),
    PrimaryKeyConstraint("evaluation_id", "item_key", "arm", "repeat"),
)

# One row per episode an evaluation played (gate.episodes): task, side and repeat, how
# it went and the conversation; the gateway's records of it share its session id.
eval_episodes = Table(
    "eval_episodes",
    metadata,
    Column("evaluation_id", ID, nullable=False),
    Column("item_key", Text, nullable=False),
    Column("arm", String(20), nullable=False),
    Column("repeat", Integer, nullable=False),
    Column("task_id", Text, nullable=False),
    Column("release_id", ID, nullable=False),
    Column("environment", Text, nullable=False),
    Column("score", Float, nullable=False),
    Column("stop", String(20), nullable=False),
    Column("reason", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("turns", Integer, nullable=False),
    Column("tool_calls", Integer, nullable=False),
    Column("tool_status_json", Text, nullable=True),
    Column("session_id", ID, nullable=True),
    Column("record_ids_json", Text, nullable=True),
    Column("messages_json", Text, nullable=True),
    Column("seconds", Float, nullable=True),
    PrimaryKeyConstraint("evaluation_id", "item_key", "arm", "repeat"),
)

# The items an evaluation asked (what a later candidate must not forget: the items that
# admitted a release become a regression suite of the releases after it).
eval_items = Table(
    "eval_items",
    metadata,
    Column("evaluation_id", ID, nullable=False),
    Column("item_key", Text, nullable=False),
    Column("suite", Text, nullable=False),
    Column("item_json", Text, nullable=False),
    PrimaryKeyConstraint("evaluation_id", "item_key"),
)

# Added in 0007: responses of the OpenAI Responses API that Reef keeps for
# ``previous_response_id`` and ``GET /v1/responses/{id}``. A row is self-contained: the
# whole input the response answered (earlier turns included) and the response itself.
# No foreign key to ``scenarios``: the row is written before the exchange's record,
# which creates the scenario row, is committed.
responses = Table(
    "responses",
    metadata,
    Column("id", ID, primary_key=True),
    Column("scenario", NAME, nullable=False),
    Column("session_id", Text, nullable=False),
    Column("record_id", ID, nullable=True),  # none when capture was off
    Column("previous_response_id", ID, nullable=True),
    Column("principal", Text, nullable=True),
    Column("input_json", Text, nullable=False),
    Column("response_json", Text, nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Index(None, "scenario", "created_at"),
)

# Spend per budget and window (``reef.gateway.budgets``, ``budgets.ledger: store``):
# tokens and money settled or reserved by requests in flight, counted by every gateway
# on the store with one atomic update per request.
spend_windows = Table(
    "spend_windows",
    metadata,
    Column("budget", Text, nullable=False),
    Column("window_start", UTCDateTime(), nullable=False),
    Column("tokens", BigInteger, nullable=False),
    Column("money", Float, nullable=False),
    PrimaryKeyConstraint("budget", "window_start"),
)

# Idempotency keys in flight (``reef.experience.claims``): the gateway that calls the
# upstream for a key, for which request (its fingerprint), and until when its lease
# holds; released once the record holding the key is written.
idempotency_claims = Table(
    "idempotency_claims",
    metadata,
    Column("scenario", Text, nullable=False),
    Column("key", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("owner", Text, nullable=False),
    Column("claimed_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
    PrimaryKeyConstraint("scenario", "key"),
)
