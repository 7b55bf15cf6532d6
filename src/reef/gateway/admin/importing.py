"""``POST /reef/scenarios/{scenario}/import``: the files ``reef import`` reads, uploaded.

The body is JSON Lines (``application/x-ndjson`` or ``application/jsonl``), read from
the request stream a line at a time into the same loop as ``reef import``
(``reef.experience.importing.LineImport``): memory holds one batch of lines, never the
whole body, so an upload of any size is taken. One line may be at most
``server.max_body_bytes`` (the largest JSON body of any other route); a longer line is
skipped and listed, its bytes discarded as they arrive. Idempotent like the command (a
second upload adds nothing); no checkpoint is kept: an upload cut short is sent again,
and what it had written is deduplicated.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from reef.core import dumps
from reef.core.errors import InvalidInputError, PermissionDeniedError
from reef.core.trust import Trust, trust_rank
from reef.experience import (
    IMPORT_BATCH_LINES,
    IMPORT_FORMATS,
    ImportOptions,
    ImportSummary,
    LineImport,
    Redactor,
    UnknownImportFormatError,
    closes_object,
    demo_trust,
    opens_object,
    reader_named,
    sniff_reader,
)
from reef.gateway.auth import grant_of
from reef.gateway.requests import check_scenario_name
from reef.gateway.state import GatewayState

UPLOAD_SOURCE: Final = "upload"
_TRUE: Final = ("true", "1", "yes")
_FALSE: Final = ("false", "0", "no")


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None or value == "":
        return False
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise InvalidInputError(f"query parameter {name!r} must be true or false, not {value!r}")


def upload_summary(summary: ImportSummary, scenario: str, dry_run: bool) -> dict[str, Any]:
    """The answer: counts, the format read and each skipped line (number and reason)."""
    return {
        "scenario": scenario,
        "format": summary.formats.get(UPLOAD_SOURCE),
        "dry_run": dry_run,
        "lines": summary.lines,
        "records": summary.records,
        "duplicate_records": summary.duplicate_records,
        "feedback": summary.feedback,
        "duplicate_feedback": summary.duplicate_feedback,
        "sessions": summary.sessions,
        "skipped": summary.skipped,
        "skips": [{"line": line, "reason": reason} for _, line, reason in summary.skips],
    }


def _demo_trust(request: Request, key_trust: Trust) -> Trust:
    """The ``demo_trust`` query parameter (default: the uploading key's trust in the
    scenario); above the key's own level it is a 403, as feedback posted by that key
    could not be either."""
    value = request.query_params.get("demo_trust")
    if not value:
        return key_trust
    try:
        level = demo_trust(value)
    except InvalidInputError as error:
        raise InvalidInputError(f"query parameter demo_trust: {error}") from error
    if trust_rank(level) > trust_rank(key_trust):
        raise PermissionDeniedError(
            f"demo_trust={level} is above this key's trust in the scenario ({key_trust}): "
            "imported feedback is written at most at the importer's own trust"
        )
    return level


class _Upload:
    """The upload's lines, fed to a ``LineImport`` made once the format is known."""

    def __init__(self, state: GatewayState, options: ImportOptions) -> None:
        self.state = state
        self.options = options
        self.summary = ImportSummary()
        self.lines: LineImport | None = None
        self.blank = 0  # empty lines before the first one (``auto`` sniffs the first)
        # Lines held before the format is known (a line, or the length of one too long),
        # while a first object written over several lines is read whole; their size.
        self.pending: list[bytes | int] = []
        self.pending_bytes = 0

    def _start(self, first: bytes) -> LineImport:
        fmt = self.options.fmt
        reader = reader_named(fmt) if fmt != "auto" else sniff_reader(first, "the upload")
        self.summary.lines += self.blank
        return LineImport(
            self.state.store, reader, self.options, self.summary, UPLOAD_SOURCE, self.blank
        )

    def _sniffing(self, line: bytes | int, limit: int) -> bool:
        """Whether ``line`` is held until the first object written over several lines
        is whole, so ``auto`` can tell the format from all of it; starts the import
        (and reads what was held) once it is."""
        if self.options.fmt != "auto" or not (
            self.pending or (isinstance(line, bytes) and opens_object(line))
        ):
            return False
        self.pending.append(line)
        self.pending_bytes += len(line) if isinstance(line, bytes) else line
        if not (isinstance(line, bytes) and closes_object(line)) and self.pending_bytes <= limit:
            return True
        self._start_held(limit)
        return True

    def _start_held(self, limit: int) -> None:
        held, self.pending = self.pending, []
        self.lines = self._start(b"\n".join(h for h in held if isinstance(h, bytes)))
        for line in held:
            self._feed(self.lines, line, limit)

    def _feed(self, lines: LineImport, line: bytes | int, limit: int) -> None:
        if isinstance(line, int):
            lines.skip(
                f"line of {line} bytes or more is longer than server.max_body_bytes ({limit} bytes)"
            )
        elif lines.add(line):
            lines.flush()

    def run(self, lines: list[bytes | int], limit: int, last: bool = False) -> None:
        """Read ``lines`` (in a worker thread: it parses and writes); ``last``: the
        upload's end (an object still open is reported)."""
        for line in lines:
            if self.lines is None:
                if not self.pending and isinstance(line, bytes) and not line.strip():
                    self.blank += 1
                    continue
                if self._sniffing(line, limit):
                    continue
                self.lines = self._start(line if isinstance(line, bytes) else b"")
            self._feed(self.lines, line, limit)
        if last and self.lines is None and self.pending:
            self._start_held(limit)
        if self.lines is not None:
            if last:
                self.lines.end()
            self.lines.flush()

    def finish(self) -> None:
        """After the last line: an upload with no line at all has no format to tell, and
        one of which no line could be read (every one skipped) wrote nothing: both are a
        400 naming what to fix, not a summary of nothing."""
        summary = self.summary
        read = summary.records + summary.duplicate_records
        read += summary.feedback + summary.duplicate_feedback
        if self.lines is not None and summary.skipped and not read:
            _, line, reason = summary.skips[0]
            name = summary.formats.get(UPLOAD_SOURCE, self.options.fmt)
            raise InvalidInputError(
                f"none of the upload's {summary.skipped} line(s) could be read as {name}, so "
                f"nothing was written; line {line}: {reason}"
            )
        if self.lines is None:
            self.summary.lines += self.blank
            if self.options.fmt != "auto":
                reader_named(self.options.fmt)
                return
            raise UnknownImportFormatError(
                "the upload is empty: send JSON Lines, one record per line, with "
                f"format=auto or one of {', '.join(IMPORT_FORMATS)}"
            )


class ImportRoutes:
    """The upload route (access: ``reef.gateway.routes``)."""

    def __init__(self, state: GatewayState) -> None:
        self.state = state
        self.redactor = Redactor(state.settings.capture.redact_patterns)

    async def upload(self, request: Request) -> Response:
        """``POST /reef/scenarios/{scenario}/import?format=&dry_run=&strict=``: import
        the JSON Lines body into the scenario; answers the summary."""
        scenario = check_scenario_name(request.path_params["scenario"])
        fmt = request.query_params.get("format") or "auto"
        if fmt != "auto":
            reader_named(fmt)  # an unknown format is a 400 before any line is read
        dry_run = _flag(request, "dry_run")
        key_trust = self.state.settings.trust_of(grant_of(request).principal.key_id, scenario)
        options = ImportOptions(
            scenario=scenario,
            fmt=fmt,
            dry_run=dry_run,
            strict=_flag(request, "strict"),
            demo_trust=_demo_trust(request, key_trust),
            redactor=self.redactor,
            max_trust=key_trust,
            max_object_bytes=self.state.settings.server.max_body_bytes,
        )
        upload = _Upload(self.state, options)
        limit = self.state.settings.server.max_body_bytes
        buffer = bytearray()
        dropping = 0  # bytes of a line too long, discarded so far
        batch: list[bytes | int] = []
        held = 0  # bytes in ``batch``: a batch is bounded by lines and by bytes
        async for chunk in request.stream():
            start = 0
            while start < len(chunk):
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                start = len(chunk) if end < 0 else end + 1
                if dropping:
                    dropping += len(piece)
                elif len(buffer) + len(piece) > limit:
                    dropping = len(buffer) + len(piece)
                    buffer.clear()
                else:
                    buffer += piece
                if end < 0:
                    continue
                batch.append(dropping or bytes(buffer))
                held += len(buffer)
                dropping = 0
                buffer.clear()
                if len(batch) >= IMPORT_BATCH_LINES or held >= limit:
                    await asyncio.to_thread(upload.run, batch, limit)
                    batch, held = [], 0
        if dropping or buffer:
            batch.append(dropping or bytes(buffer))
        await asyncio.to_thread(upload.run, batch, limit, True)
        upload.finish()
        return Response(
            dumps(upload_summary(upload.summary, scenario, dry_run)),
            media_type="application/json",
        )
