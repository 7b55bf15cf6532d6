"""Server-Sent Events: an incremental parser and a small encoder.

The parser follows the WHATWG event-stream rules for what model servers send: lines
end in CRLF, LF or CR; ``data`` lines of one event are joined with ``\\n``; lines that
start with ``:`` are comments; a blank line ends an event; an event without data is
not dispatched. ``id`` and ``retry`` are ignored (no model server relies on them).
Bytes may be split anywhere, also inside a CRLF or a UTF-8 sequence.

Lines with any other field name are ignored too, as the rules say, but counted (and
the first kept): a body of them is not an event stream at all (NDJSON, an HTML page),
which a caller whose stream then ends badly can name.

A line is held until its end arrives, so the parser holds at most ``max_line_bytes``
of one: an upstream that sends bytes without a line break is stopped there
(``SSELineTooLongError``), not buffered until memory runs out.
"""

from __future__ import annotations

from typing import NamedTuple

from reef.upstream.base import DEFAULT_MAX_SSE_LINE_BYTES, UpstreamOversizedError

_BOM = b"\xef\xbb\xbf"
_KNOWN_FIELDS = frozenset({"data", "event", "id", "retry"})
_SAMPLE_CHARS = 80


class SSEEvent(NamedTuple):
    """One dispatched event: its ``event`` field (``None`` when absent) and data."""

    event: str | None
    data: str


class SSELineTooLongError(UpstreamOversizedError):
    """An event-stream line grew past the parser's ``max_line_bytes`` without ending."""


class SSEParser:
    """Feed raw bytes in, get complete events out.

    ``unknown_lines`` counts lines that are neither comments nor ``data``, ``event``,
    ``id`` or ``retry`` fields; ``first_unknown_line`` is the start of the first.
    ``max_line_bytes`` bounds the unterminated line it holds (``buffered``): ``feed``
    raises ``SSELineTooLongError`` past it.
    """

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_SSE_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self.unknown_lines = 0
        self.first_unknown_line: str | None = None
        # The unterminated end of the bytes so far, in pieces: a long line that arrives in
        # many chunks is joined once, when its end arrives (not once per chunk).
        self._tail: list[bytes] = []
        self._held = 0  # bytes in ``_tail``
        # A line past the bound that followed events of the same chunk: those are
        # returned first, and this is raised by the next call.
        self._failure: SSELineTooLongError | None = None
        self._event: str | None = None
        self._data: list[str] = []
        self._skip_lf = False  # the previous chunk ended in CR; a leading LF pairs with it
        self._started = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:  # noqa: C901
        """Parse ``chunk``; return the events it completes (possibly none)."""
        if self._failure is not None:
            raise self._failure
        if not chunk:
            return []
        if self._skip_lf:
            self._skip_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if self._started and b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                self._hold(chunk)
            return []
        buffer = b"".join((*self._tail, chunk)) if self._tail else chunk
        self._tail = []
        self._held = 0
        if not self._started:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._hold(buffer)
                return []
            self._started = True
            if buffer.startswith(_BOM):
                buffer = buffer[len(_BOM) :]
        events: list[SSEEvent] = []
        start = 0
        end = len(buffer)
        if b"\r" not in buffer:  # the common case: LF only
            while (newline := buffer.find(b"\n", start)) != -1:
                self._line(buffer[start:newline], events)
                start = newline + 1
        else:
            lf = -1
            while start < end:
                if lf < start:
                    lf = buffer.find(b"\n", start)
                    if lf == -1:
                        lf = end
                cr = buffer.find(b"\r", start, lf)
                if cr != -1:
                    self._line(buffer[start:cr], events)
                    if cr + 1 == end:
                        self._skip_lf = True
                        start = end
                    else:
                        start = cr + 2 if buffer[cr + 1 : cr + 2] == b"\n" else cr + 1
                elif lf != end:
                    self._line(buffer[start:lf], events)
                    start = lf + 1
                else:
                    break
        if start < end:
            try:
                self._hold(buffer[start:])
            except SSELineTooLongError as exc:
                if not events:
                    raise
                self._failure = exc
        return events

    @property
    def buffered(self) -> int:
        """Bytes of the unterminated line held (never more than ``max_line_bytes``)."""
        return self._held

    def _hold(self, piece: bytes) -> None:
        """Keep ``piece`` of a line whose end has not arrived, within the bound."""
        held = self._held + len(piece)
        if held > self.max_line_bytes:
            self._tail = []  # what was held is dropped: the stream cannot go on
            self._held = 0
            raise SSELineTooLongError(
                f"the upstream sent an event-stream line longer than {self.max_line_bytes} "
                "bytes without ending it; raise the upstream's max_sse_line_bytes if its "
                "events are legitimately that long"
            )
        self._tail.append(piece)
        self._held = held

    def finish(self) -> list[SSEEvent]:
        """End of stream: an unterminated last line and event are dispatched too (or
        ``SSELineTooLongError`` raised, when ``feed`` held one back).

        Strict SSE would drop them; servers that forget the final blank line are
        common enough that dropping their last event loses real data.
        """
        if self._failure is not None:
            raise self._failure
        events: list[SSEEvent] = []
        if self._tail:
            self._line(b"".join(self._tail), events)
            self._tail = []
            self._held = 0
        self._line(b"", events)
        return events

    def _line(self, raw: bytes, events: list[SSEEvent]) -> None:
        if not raw:
            if self._data:
                events.append(SSEEvent(self._event, "\n".join(self._data)))
            self._event = None
            self._data = []
            return
        line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            return
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value or None
        elif name not in _KNOWN_FIELDS:
            self.unknown_lines += 1
            if self.first_unknown_line is None:
                self.first_unknown_line = line[:_SAMPLE_CHARS]


def encode_sse(data: bytes, event: str | None = None) -> bytes:
    """One SSE event: an optional ``event:`` line, one ``data:`` line per line of
    ``data``, and the blank line that ends it."""
    head = b"event: " + event.encode() + b"\n" if event else b""
    if b"\n" not in data and b"\r" not in data:
        return head + b"data: " + data + b"\n\n"
    lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
