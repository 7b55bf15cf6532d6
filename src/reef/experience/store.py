"""The ``ExperienceStore`` contract. ``SQLExperienceStore`` implements it for SQLite and
PostgreSQL; other backends register under the ``reef.stores`` entry-point group."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import datetime

from reef.experience.records import (
    FeedbackDraft,
    FeedbackView,
    RecordDraft,
    RecordFilter,
    RecordPage,
    RecordView,
    ReleaseTraffic,
    SessionMatch,
)


class ExperienceStore(ABC):
    """Durable experience: records, feedback, and the release bookkeeping they need.

    Methods are synchronous and thread-safe; async callers run them in a thread. Writes of
    records go through ``reef.experience.writer.RecordWriter``, which batches them.
    """

    @abstractmethod
    def migrate(self) -> None:
        """Create or upgrade the schema to the latest version (Alembic). Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""

    @abstractmethod
    def ping(self) -> None:
        """Prove the store is writable; raises ``StoreUnavailableError`` when it is not."""

    def probe_write(self) -> None:
        """Prove that a write needing new space commits (a full disk fails it), leaving
        nothing behind; raises ``StoreUnavailableError`` when it does not. The default
        is ``ping``."""
        self.ping()

    @abstractmethod
    def write_records(self, drafts: Sequence[RecordDraft]) -> list[str]:
        """Insert ``drafts`` in one transaction; return the stored id of each draft, in order.

        A draft whose ``(scenario, idempotency_key)`` was already stored is not inserted;
        its entry in the result is the first record's id. ``turn`` is assigned as one more
        than the highest turn already stored for the session (0 for a new session).
        """

    def write_records_now(self, drafts: Sequence[RecordDraft]) -> list[str] | None:
        """``write_records``, but only when that cannot wait: no other writer's lock to
        wait for, no network round trip. ``None`` when it would have to wait (nothing
        was written); the caller then queues the drafts for ``write_records``.

        For a caller on an event loop with nothing else to do meanwhile, which saves
        the hand-off to a writer thread. The default never writes now.
        """
        return None

    @abstractmethod
    def release_traffic(
        self, scenario: str, release_ids: Collection[str]
    ) -> dict[str, ReleaseTraffic]:
        """The live traffic each of ``release_ids`` served in ``scenario`` and how it was
        scored (``ReleaseTraffic``); a release that served nothing is left out."""

    @abstractmethod
    def settle_pending(self, before: datetime) -> int:
        """Mark records still ``pending`` (streams whose end was never written) that were
        created before ``before`` as ``aborted``, saying the gateway stopped mid-stream;
        how many. A gateway calls it as it starts, with its start time. A stream still
        running on another gateway of the same store is marked too, and its end then
        writes its real outcome over the mark."""

    @abstractmethod
    def find_session(
        self, scenario: str, continuation_hashes: Sequence[str]
    ) -> SessionMatch | None:
        """The record whose ``continuation_hash`` is one of ``continuation_hashes``.

        The hashes are ordered longest prefix first; the first that matches wins (the
        newest record among equals).
        """

    @abstractmethod
    def find_by_idempotency_key(self, scenario: str, key: str) -> str | None:
        """Id of the record stored with this idempotency key, if any."""

    def find_by_idempotency_keys(self, scenario: str, keys: Sequence[str]) -> dict[str, str]:
        """key -> id of the records stored with one of ``keys``; the default asks
        ``find_by_idempotency_key`` per key."""
        found = {key: self.find_by_idempotency_key(scenario, key) for key in dict.fromkeys(keys)}
        return {key: record_id for key, record_id in found.items() if record_id is not None}

    @abstractmethod
    def add_feedback(self, draft: FeedbackDraft) -> tuple[str, bool]:
        """Store feedback; return ``(feedback_id, created)``.

        Raises ``RecordNotFoundError`` naming the first id not in ``draft.scenario``;
        ``InvalidInputError`` for a non-finite score, for neither record ids nor a session
        id, or, with a ``session_id``, for more than one record id or one of another
        session; ``SessionNotFoundError`` for a session the scenario does not have. The same
        idempotency key with the same body returns the first id with ``created=False``;
        with a different body raises ``IdempotencyConflictError``.
        """

    def add_feedback_many(self, drafts: Sequence[FeedbackDraft]) -> list[tuple[str, bool]]:
        """``add_feedback`` for each draft, in order, all in one transaction where the
        backend has them: all are stored or, when one raises (what ``add_feedback``
        raises), none. The default calls ``add_feedback`` per draft (not atomic)."""
        return [self.add_feedback(draft) for draft in drafts]

    @abstractmethod
    def session_feedback(self, scenario: str, session_id: str | None = None) -> list[FeedbackView]:
        """The outcomes given on sessions of ``scenario`` (feedback with a ``session_id``;
        only ``session_id``'s when given), oldest first. Quarantined ones included: each
        view says whether it is held back."""

    @abstractmethod
    def new_feedback_count(self, scenario: str, since: datetime | None) -> int:
        """Feedback rows of ``scenario`` created after ``since`` (all when None): what the
        ``min_new_feedback`` learning trigger counts."""

    @abstractmethod
    def get_feedback(self, feedback_id: str) -> FeedbackView:
        """One feedback row; raises ``FeedbackNotFoundError``."""

    @abstractmethod
    def list_feedback(
        self,
        scenario: str,
        quarantined: bool | None = None,
        before: str | None = None,
        limit: int = 100,
    ) -> list[FeedbackView]:
        """The scenario's feedback, newest first (by id); ``quarantined`` True/False keeps
        only feedback that is / is not held back now; ``before`` an id to page from."""

    @abstractmethod
    def quarantine_feedback(self, reasons: Mapping[str, str]) -> int:
        """Hold back each feedback id with its reason; return how many were newly held.

        Feedback already quarantined, or released by an admin, is left as it is (a
        release is final); unknown ids are ignored.
        """

    @abstractmethod
    def release_feedback(self, feedback_id: str, actor: str | None) -> FeedbackView:
        """Let quarantined feedback through again (it may train and be evidence); the
        reason stays for the record. Raises ``FeedbackNotFoundError`` or
        ``FeedbackNotQuarantinedError``."""

    @abstractmethod
    def get_record(self, record_id: str) -> RecordView:
        """One record with its feedback; raises ``RecordNotFoundError``."""

    @abstractmethod
    def list_records(
        self, scenario: str, filters: RecordFilter, cursor: str | None, limit: int
    ) -> RecordPage:
        """Newest first, ``limit`` per page; ``cursor`` comes from the previous page."""

    @abstractmethod
    def get_session(self, scenario: str, session_id: str) -> list[RecordView]:
        """The session's records in turn order; raises ``SessionNotFoundError`` if none."""

    @abstractmethod
    def iter_export(self, scenario: str, since: str | None = None) -> Iterator[RecordView]:
        """Every record of the scenario, oldest first, with feedback, streamed."""
