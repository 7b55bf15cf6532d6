"""``import_file``: stream one JSON Lines file through a reader into the store.

Lines are read one at a time and written in batches of ``BATCH_LINES``; after each
batch's records and feedback are committed, the checkpoint moves past it. A run killed
anywhere is rerun from the checkpoint: a batch it had committed but not checkpointed is
read again and deduplicated (idempotency keys, see ``base``), so nothing is lost and
nothing doubles. Sessions without a source id are inferred as for live traffic: a
record whose conversation extends an earlier record's conversation and reply joins its
session (the continuation hashes of ``reef.upstream``), looked up among this run's
records first, then in the store.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from reef.core.errors import InvalidInputError, NotFoundError
from reef.core.ids import new_id
from reef.core.jsoncodec import loads, sha256_hex
from reef.core.trust import Trust, trust_rank
from reef.experience.errors import IdempotencyConflictError
from reef.experience.importing.base import (
    IMPORT_ORIGIN_PREFIX,
    ORIGIN_TAG,
    SOURCE_TAG,
    ImportedFeedback,
    ImportedRecord,
    ImportItem,
    ImportLineError,
    ImportReader,
)
from reef.experience.importing.checkpoint import Checkpoint, CheckpointFile, file_digest
from reef.experience.importing.readers import IMPORT_FORMATS, READERS
from reef.experience.records import FeedbackDraft, Purpose, RecordDraft, RecordStatus
from reef.experience.redaction import Redactor
from reef.experience.store import ExperienceStore
from reef.upstream import (
    canonical_reply,
    canonical_request,
    chain_hashes,
    continuation_candidates,
    extend_chain,
)

BATCH_LINES = 1000
# A JSON object written over several lines (``json.dumps(indent=...)``, ``jq .``: the
# OpenTelemetry Python SDK's console exporter, a downloaded Langfuse trace) is read as
# one line when it opens with a line that is only ``{`` and closes with one that is only
# ``}``; one larger than this is skipped, its bytes not held.
MAX_OBJECT_BYTES = 64 << 20
MAX_SKIPS_KEPT = 1000  # skipped lines listed in the summary; beyond, only counted
SESSION_MEMORY = 100_000  # continuation hashes of this run remembered for inference
_APIS = get_args(RecordDraft.__annotations__["api"]) or (
    "openai.chat",
    "anthropic.messages",
    "openai.responses",
    "openai.completions",
    "openai.embeddings",
)


class UnknownImportFormatError(InvalidInputError):
    """``--format`` names no reader, or ``auto`` recognised no format."""


@dataclass(frozen=True)
class ImportOptions:
    """How to import: into ``scenario``, from ``fmt`` (a reader name or ``auto``)."""

    scenario: str
    fmt: str = "auto"
    dry_run: bool = False
    strict: bool = False
    demo_trust: Trust = "operator"
    redactor: Redactor | None = None
    checkpoint_dir: Path | None = None  # None: no resume point kept
    # The importer's own trust: no feedback row is written above it (a row of Reef's
    # format carrying a higher level, an upload's ``demo_trust``), as no feedback a
    # principal posts is.
    max_trust: Trust = "operator"
    # The largest JSON object written over several lines that is read (module constant).
    max_object_bytes: int = MAX_OBJECT_BYTES


@dataclass
class ImportSummary:
    """What an import did, over every file."""

    lines: int = 0
    records: int = 0
    duplicate_records: int = 0
    feedback: int = 0
    duplicate_feedback: int = 0
    sessions: int = 0
    skipped: int = 0
    skips: list[tuple[str, int, str]] = field(default_factory=list)  # path, line, reason
    formats: dict[str, str] = field(default_factory=dict)  # path -> format read
    resumed: dict[str, int] = field(default_factory=dict)  # path -> line resumed after

    def skip(self, path: Path | str, line: int, reason: str) -> None:
        """Count a skipped line (listing the first ``MAX_SKIPS_KEPT``)."""
        self.skipped += 1
        if len(self.skips) < MAX_SKIPS_KEPT:
            self.skips.append((str(path), line, reason))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dataclasses.asdict(self)


ProgressCallback = Callable[[int, ImportSummary], None]  # bytes read so far, summary


def reader_named(fmt: str) -> ImportReader:
    """The reader called ``fmt`` (not ``auto``). Raises ``UnknownImportFormatError``
    naming the formats."""
    reader = READERS.get(fmt)
    if reader is None:
        raise UnknownImportFormatError(
            f"unknown import format {fmt!r}; use auto or one of {', '.join(IMPORT_FORMATS)}"
        )
    return reader


def sniff_reader(first: bytes, where: str) -> ImportReader:
    """The first reader whose ``sniff`` accepts ``first`` (a source's first non-empty
    line), for ``auto``. Raises ``UnknownImportFormatError`` naming the formats."""
    try:
        parsed = loads(first)
    except ValueError:
        parsed = None
    for reader in READERS.values():
        if reader.sniff(parsed):
            return reader
    raise UnknownImportFormatError(
        f"{where}: cannot tell the format from its first line; pass the format, one of "
        f"{', '.join(IMPORT_FORMATS)}"
    )


def opens_object(raw: bytes) -> bool:
    """Whether ``raw`` is the first line of a JSON object written over several lines (a
    line that is only ``{``; the length test spares every other line a copy)."""
    return len(raw) < 16 and raw.rstrip() == b"{"


def closes_object(raw: bytes) -> bool:
    """Whether ``raw`` is the last line of such an object (a line that is only ``}``:
    inner objects are indented)."""
    return raw.rstrip() == b"}"


def first_entry(lines: Iterable[bytes], max_bytes: int = MAX_OBJECT_BYTES) -> bytes | None:
    """The first non-empty line of ``lines``, or the whole first object when it is
    written over several lines (up to ``max_bytes``); None for none."""
    held: list[bytes] = []
    size = 0
    for raw in lines:
        if not held:
            if not raw.strip():
                continue
            if not opens_object(raw):
                return raw
        held.append(raw)
        size += len(raw)
        if closes_object(raw) or size > max_bytes:
            break
    return b"\n".join(held) if held else None


def resolve_format(path: Path, fmt: str) -> ImportReader:
    """The reader for ``fmt``; with ``auto``, the first whose ``sniff`` accepts the
    file's first non-empty line (or first object written over several lines). Raises
    ``UnknownImportFormatError`` naming the formats."""
    if fmt != "auto":
        return reader_named(fmt)
    with path.open("rb") as stream:
        first = first_entry(stream)
        if first is not None:
            return sniff_reader(first, str(path))
    raise UnknownImportFormatError(
        f"{path}: cannot tell the format of an empty file; pass --format with one of "
        f"{', '.join(IMPORT_FORMATS)}"
    )


class LineImport:
    """One source read line by line into ``options.scenario``: ``add`` each line (its
    number is counted here), ``flush`` when ``add`` says a batch is full and at the end.

    ``store`` None, or ``dry_run``: lines are read and checked, nothing is written. The
    file loop (``import_file``) and the HTTP upload (``POST /reef/scenarios/{s}/import``)
    both feed one, so both read, deduplicate and report alike."""

    def __init__(
        self,
        store: ExperienceStore | None,
        reader: ImportReader,
        options: ImportOptions,
        summary: ImportSummary,
        source: str,
        first_line: int = 0,
    ) -> None:
        self.reader = reader
        self.options = options
        self.summary = summary
        self.source = source
        self.line_no = first_line
        self.batch: list[tuple[int, ImportItem]] = []
        self.max_object_bytes = options.max_object_bytes
        # An object written over several lines, being read: its lines so far (None when
        # it grew past ``max_object_bytes``: dropped), its first line's number, its size.
        self.object: list[bytes] | None = None
        self.object_line = 0
        self.object_bytes = -1  # -1: no object open
        self.importer = (
            None if options.dry_run or store is None else _Importer(store, reader, options)
        )
        summary.formats[source] = reader.name

    def add(self, raw: bytes) -> bool:
        """Read one line (a bad one is skipped and listed, or, ``strict``, raises
        ``ImportLineError`` with its number); True when the batch is full. A JSON object
        written over several lines is read when its closing line comes, numbered by its
        first line; True is only answered there, never inside one."""
        self.line_no += 1
        self.summary.lines += 1
        if self.object_bytes >= 0:
            return self._continue_object(raw)
        if opens_object(raw):
            self.object, self.object_line, self.object_bytes = [raw], self.line_no, len(raw)
            return False
        return self._read(raw, self.line_no)

    def _read(self, raw: bytes, line_no: int) -> bool:
        item = _read_line(self.reader, raw, self.source, line_no, self.options.strict, self.summary)
        if item is not None:
            self.batch.append((line_no, item))
        return len(self.batch) >= BATCH_LINES

    def _continue_object(self, raw: bytes) -> bool:
        """One more line of the open object; at its closing line, the object read."""
        self.object_bytes += len(raw)
        if self.object is not None:
            self.object.append(raw)
            if self.object_bytes > self.max_object_bytes:
                self.object = None  # dropped: its bytes are not held
        if not closes_object(raw):
            return False
        held, line, size = self.object, self.object_line, self.object_bytes
        self.object, self.object_bytes = None, -1
        if held is None:
            self._skip_at(
                line, f"object of {size} bytes or more is larger than {self.max_object_bytes}"
            )
            return False
        return self._read(b"\n".join(held), line)

    def end(self) -> None:
        """At the end of the source: an object opened and never closed is skipped (or,
        ``strict``, raises ``ImportLineError``)."""
        if self.object_bytes < 0:
            return
        line = self.object_line
        self.object, self.object_bytes = None, -1
        self._skip_at(line, "object opened by a '{' line is not closed by a '}' line")

    def skip(self, reason: str) -> None:
        """Count a line that was not read at all (too long to hold), listing ``reason``;
        ``strict``: raises ``ImportLineError``."""
        self.line_no += 1
        self.summary.lines += 1
        self._skip_at(self.line_no, reason)

    def _skip_at(self, line_no: int, reason: str) -> None:
        if self.options.strict:
            raise ImportLineError(f"{self.source}:{line_no}: {reason} (strict)")
        self.summary.skip(self.source, line_no, reason)

    def flush(self) -> None:
        """Write the batch read so far (one transaction for its records)."""
        batch, self.batch = self.batch, []
        _flush(self.importer, batch, self.summary, self.source)


def import_file(
    store: ExperienceStore | None,
    path: Path,
    options: ImportOptions,
    summary: ImportSummary,
    progress: ProgressCallback | None = None,
) -> None:
    """Import ``path`` into ``options.scenario``, adding to ``summary``.

    ``store`` may be None only with ``dry_run`` (lines are read and checked, nothing is
    written and no checkpoint is kept). Raises ``UnknownImportFormatError``,
    ``ImportLineError`` (``strict``: the first bad line, with its number) and the store's
    errors; a bad line otherwise is skipped and listed in ``summary``."""
    reader = resolve_format(path, options.fmt)
    writes = not (options.dry_run or store is None)
    checkpoint = None
    point = Checkpoint()
    if writes and options.checkpoint_dir is not None:
        checkpoint = CheckpointFile(
            options.checkpoint_dir, file_digest(path), options.scenario, reader.name
        )
        point = checkpoint.load()
        if point.line:
            summary.resumed[str(path)] = point.line
    lines = LineImport(store, reader, options, summary, str(path), point.line)
    with path.open("rb") as stream:
        stream.seek(point.offset)
        while raw := stream.readline():
            if lines.add(raw):
                lines.flush()
                if checkpoint is not None:
                    checkpoint.save(Checkpoint(stream.tell(), lines.line_no))
                if progress is not None:
                    progress(stream.tell(), summary)
        lines.end()
        lines.flush()
        if progress is not None:
            progress(stream.tell(), summary)
    if checkpoint is not None:
        checkpoint.clear()


def _capped(level: Trust, ceiling: Trust) -> Trust:
    """``level``, or ``ceiling`` when ``level`` is above it."""
    return level if trust_rank(level) <= trust_rank(ceiling) else ceiling


def _read_line(
    reader: ImportReader,
    raw: bytes,
    source: str,
    line_no: int,
    strict: bool,
    summary: ImportSummary,
) -> ImportItem | None:
    if not raw.strip():
        return None
    try:
        try:
            parsed = loads(raw)
        except ValueError as error:
            raise ImportLineError(f"not JSON: {error}") from error
        item = reader.read(parsed)
        for problem in item.problems:
            if strict:
                raise ImportLineError(problem)
            summary.skip(source, line_no, problem)
        return item
    except (ImportLineError, ValueError, TypeError) as error:
        reason = str(error) or type(error).__name__
        if strict:
            raise ImportLineError(f"{source}:{line_no}: {reason} (--strict)") from error
        summary.skip(source, line_no, reason)
        return None


def _flush(
    importer: _Importer | None,
    batch: list[tuple[int, ImportItem]],
    summary: ImportSummary,
    source: str,
) -> None:
    if not batch:
        return
    if importer is None:  # a dry run counts what it would write
        for _, item in batch:
            summary.records += len(item.records)
            summary.feedback += len(item.feedback)
        return
    importer.write(batch, summary, source)


class _Importer:
    """Writes batches of items to the store: dedup, session inference, redaction."""

    def __init__(self, store: ExperienceStore, reader: ImportReader, options: ImportOptions):
        self.store = store
        self.options = options
        self.origin = IMPORT_ORIGIN_PREFIX + reader.name
        self.redactor = options.redactor or Redactor(())
        self.sessions: OrderedDict[str, str] = OrderedDict()  # continuation -> session
        self.session_keys: set[str] = set()
        self.batch_keys: dict[str, str] = {}
        self.stored_keys: dict[str, str] = {}  # of this batch's records, stored before it

    def write(self, batch: list[tuple[int, ImportItem]], summary: ImportSummary, path: str) -> None:
        """Write the batch's records in one transaction, then their feedback."""
        drafts: list[RecordDraft] = []
        placed: list[list[str | None]] = []  # per item: stored id of each record (pending)
        pending: list[tuple[int, int, RecordDraft]] = []
        self.batch_keys = {}  # a line repeated within the batch is a duplicate
        self.stored_keys = self.store.find_by_idempotency_keys(
            self.options.scenario,
            [self._key(record) for _, item in batch for record in item.records],
        )
        for position, (line_no, item) in enumerate(batch):
            ids: list[str | None] = []
            for index, record in enumerate(item.records):
                try:
                    stored = self._stored(record)
                    if stored is not None:
                        summary.duplicate_records += 1
                        ids.append(stored)
                        continue
                    draft = self._draft(record, summary)
                except (ImportLineError, InvalidInputError) as error:
                    summary.skip(path, line_no, str(error))
                    ids.append(None)
                    continue
                self.batch_keys[self._key(record)] = draft.id
                drafts.append(draft)
                pending.append((position, index, draft))
                ids.append(draft.id)
            placed.append(ids)
        written = self.store.write_records(drafts)
        for (position, index, draft), stored_id in zip(pending, written, strict=True):
            placed[position][index] = stored_id
            if stored_id == draft.id:
                summary.records += 1
            else:
                summary.duplicate_records += 1
        self._write_feedback(self._batch_feedback(batch, placed, summary, path), summary, path)

    def _batch_feedback(
        self,
        batch: list[tuple[int, ImportItem]],
        placed: list[list[str | None]],
        summary: ImportSummary,
        path: str,
    ) -> list[tuple[int, str, FeedbackDraft]]:
        """The batch's feedback drafts; one naming a record never imported is skipped."""
        feedback: list[tuple[int, str, FeedbackDraft]] = []
        for (line_no, item), ids in zip(batch, placed, strict=True):
            for entry in item.feedback:
                try:
                    given = self._feedback_draft(entry, ids, item)
                except ImportLineError as error:
                    summary.skip(path, line_no, str(error))
                    continue
                if given is not None:
                    feedback.append((line_no, entry.source_id, given))
        return feedback

    def _write_feedback(
        self, feedback: list[tuple[int, str, FeedbackDraft]], summary: ImportSummary, path: str
    ) -> None:
        """The batch's feedback in one transaction; when one row is refused, row by row,
        so the others are kept and the refused one is reported with its line."""
        drafts = [self.redactor.redact_feedback(draft) for _, _, draft in feedback]
        try:
            results = self.store.add_feedback_many(drafts)
        except (InvalidInputError, NotFoundError, IdempotencyConflictError):
            results = []
            for (line_no, source_id, _), draft in zip(feedback, drafts, strict=True):
                try:
                    results.append(self.store.add_feedback(draft))
                except (InvalidInputError, NotFoundError, IdempotencyConflictError) as error:
                    summary.skip(path, line_no, f"feedback {source_id}: {error}")
        for _, created in results:
            if created:
                summary.feedback += 1
            else:
                summary.duplicate_feedback += 1

    def _key(self, record: ImportedRecord) -> str:
        if record.idempotency_key is not None:
            return record.idempotency_key
        return f"{self.origin}:{record.source_id}"

    def _stored(self, record: ImportedRecord) -> str | None:
        """The id of the record already stored (or in this batch) for this source record."""
        if self._key(record) in self.batch_keys:
            return self.batch_keys[self._key(record)]
        if record.record_id is not None:
            try:
                return self.store.get_record(record.record_id).id
            except NotFoundError:
                pass
        return self.stored_keys.get(self._key(record))

    def _by_source(self, source_id: str) -> str | None:
        """The id of the record imported (by this format) with ``source_id``."""
        key = f"{self.origin}:{source_id}"
        if key in self.batch_keys:
            return self.batch_keys[key]
        return self.store.find_by_idempotency_key(self.options.scenario, key)

    def _draft(self, record: ImportedRecord, summary: ImportSummary) -> RecordDraft:
        if record.api not in _APIS:
            raise ImportLineError(f"unknown api {record.api!r}; one of {', '.join(_APIS)}")
        if record.status not in get_args(RecordStatus) or record.status == "pending":
            raise ImportLineError(f"status {record.status!r} cannot be imported")
        if record.purpose not in get_args(Purpose):
            raise ImportLineError(f"unknown purpose {record.purpose!r}")
        conversation = canonical_request(record.api, record.request)
        chain = chain_hashes(conversation)
        continuation: str | None = None
        if record.hashes is not None:
            prompt_hash, content_hash, continuation = record.hashes
        else:
            prompt_hash = chain[-1] if chain else sha256_hex(b"")
            content_hash = sha256_hex(f"{prompt_hash}:{record.status}:{record.error}".encode())
            if record.response is not None and record.status == "ok":
                reply = canonical_reply(record.api, record.response, record.request)
                continuation = extend_chain(chain[-1] if chain else None, reply)
                content_hash = continuation
        session_id, is_new, formed = self._session(record, conversation, chain)
        if formed:
            summary.sessions += 1
        if continuation is not None:
            self.sessions[continuation] = session_id
            if len(self.sessions) > SESSION_MEMORY:
                self.sessions.popitem(last=False)
        draft = RecordDraft(
            id=record.record_id or new_id(),
            scenario=self.options.scenario,
            session_id=session_id,
            api=record.api,  # type: ignore[arg-type]
            request=record.request,
            response=record.response,
            status=record.status,  # type: ignore[arg-type]
            error=record.error,
            latency_ms=record.latency_ms,
            usage=record.usage,
            release_id=None,  # imported answers were served by no release of Reef's
            prompt_hash=prompt_hash,
            content_hash=content_hash,
            continuation_hash=continuation,
            tags={**record.tags, ORIGIN_TAG: self.origin, SOURCE_TAG: record.source_id},
            principal=record.principal,
            purpose=record.purpose,  # type: ignore[arg-type]
            idempotency_key=self._key(record),
            created_at=record.created_at,
            session_is_new=is_new,
        )
        return self.redactor.redact_draft(draft)

    def _session(
        self, record: ImportedRecord, conversation: list[dict[str, Any]], chain: list[str]
    ) -> tuple[str, bool, bool]:
        """The record's session, whether it was minted here (no earlier turn can exist)
        and whether this run formed it (a source session id first seen, or minted)."""
        if record.session_key is not None:
            formed = record.session_key not in self.session_keys
            if formed and len(self.session_keys) < SESSION_MEMORY:
                self.session_keys.add(record.session_key)
            return record.session_key, False, formed
        candidates = continuation_candidates(conversation, chain)
        for candidate in candidates:
            if candidate in self.sessions:
                return self.sessions[candidate], False, False
        if candidates:
            match = self.store.find_session(self.options.scenario, candidates)
            if match is not None:
                return match.session_id, False, False
        return new_id(), True, True

    def _feedback_draft(
        self, entry: ImportedFeedback, ids: list[str | None], item: ImportItem
    ) -> FeedbackDraft | None:
        """The feedback to write for ``entry``; None when its record was skipped, or
        when it is written on a later line."""
        record_ids = entry.record_ids
        session_id = entry.session_id
        if entry.record_sources:
            found = [self._by_source(source) for source in entry.record_sources]
            if all(found):
                record_ids, session_id = tuple(i for i in found if i is not None), None
            elif session_id is None:
                missing = entry.record_sources[found.index(None)]
                raise ImportLineError(
                    f"feedback {entry.source_id}: no imported record has source id "
                    f"{missing!r} (import the file holding it first)"
                )
            else:
                record_ids = ()  # not a record's id: the outcome of the session it names
        elif entry.record_indexes:
            chosen = [ids[i] for i in entry.record_indexes if i < len(ids)]
            if None in chosen or not chosen:
                return None  # its record was skipped (and reported)
            record_ids = tuple(i for i in chosen if i is not None)
        elif record_ids and item.records and item.records[0].record_id != max(record_ids):
            # Reef's export repeats feedback on every record it names: it is written on
            # the line of the last of them, when all its records are stored.
            return None
        return FeedbackDraft(
            scenario=self.options.scenario,
            record_ids=record_ids,
            score=entry.score,
            feedback=entry.feedback,
            correction=entry.correction,
            metadata=entry.metadata,
            principal=entry.principal or self.origin,
            idempotency_key=entry.idempotency_key or f"{self.origin}:{entry.source_id}",
            trust=_capped(entry.trust or self.options.demo_trust, self.options.max_trust),
            session_id=session_id,
            source=entry.source,
            confidence=entry.confidence,
        )
