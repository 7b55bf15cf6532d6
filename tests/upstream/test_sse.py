"""The incremental SSE parser and encoder."""

from __future__ import annotations

import pytest

from reef.upstream.sse import SSEEvent, SSEParser, encode_sse

STREAM = (
    b": a comment\n"
    b"event: message_start\n"
    b'data: {"a": 1}\n'
    b"\n"
    b"data: line one\n"
    b"data: line two\n"
    b"\n"
    b"data:no-space\n"
    b"\n"
    b"data: caf\xc3\xa9\n"
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
EXPECTED = [
    SSEEvent("message_start", '{"a": 1}'),
    SSEEvent(None, "line one\nline two"),
    SSEEvent(None, "no-space"),
    SSEEvent(None, "café"),
    SSEEvent(None, "[DONE]"),
]


def parse_in_pieces(data: bytes, size: int) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for start in range(0, len(data), size):
        events.extend(parser.feed(data[start : start + size]))
    return events + parser.finish()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_events_survive_any_chunking(size: int) -> None:
    assert parse_in_pieces(STREAM, size) == EXPECTED


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"])
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_crlf_and_cr_line_endings(newline: bytes, size: int) -> None:
    assert parse_in_pieces(STREAM.replace(b"\n", newline), size) == EXPECTED


def test_every_split_point_of_a_crlf_stream() -> None:
    data = STREAM.replace(b"\n", b"\r\n")
    for cut in range(len(data)):
        parser = SSEParser()
        events = parser.feed(data[:cut]) + parser.feed(data[cut:]) + parser.finish()
        assert events == EXPECTED, cut


def test_event_without_data_is_not_dispatched_and_name_resets() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: ping\n\ndata: x\n\n") == [SSEEvent(None, "x")]


def test_field_without_colon_and_unknown_fields() -> None:
    parser = SSEParser()
    events = parser.feed(b"data\nid: 7\nretry: 10\nfoo: bar\ndata: y\n\n")
    assert events == [SSEEvent(None, "\ny")]


def test_leading_bom_is_ignored_even_when_split() -> None:
    parser = SSEParser()
    events = parser.feed(b"\xef\xbb") + parser.feed(b"\xbfdata: a\n\n")
    assert events == [SSEEvent(None, "a")]


def test_finish_dispatches_an_unterminated_event() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: last") == []
    assert parser.finish() == [SSEEvent(None, "last")]
    assert parser.finish() == []


def test_events_unpack_as_pairs() -> None:
    [(name, data)] = SSEParser().feed(b"event: e\ndata: d\n\n")
    assert (name, data) == ("e", "d")


@pytest.mark.parametrize(
    ("data", "event", "wire"),
    [
        (b"{}", None, b"data: {}\n\n"),
        (b"{}", "message_stop", b"event: message_stop\ndata: {}\n\n"),
        (b"a\nb", None, b"data: a\ndata: b\n\n"),
        (b"a\r\nb\rc", "x", b"event: x\ndata: a\ndata: b\ndata: c\n\n"),
    ],
)
def test_encode_sse(data: bytes, event: str | None, wire: bytes) -> None:
    assert encode_sse(data, event) == wire


def test_encode_then_parse_round_trips() -> None:
    wire = encode_sse(b"one\ntwo", "e") + encode_sse(b"three")
    parser = SSEParser()
    assert parser.feed(wire) == [SSEEvent("e", "one\ntwo"), SSEEvent(None, "three")]


def test_lines_of_unknown_fields_are_ignored_and_counted() -> None:
    parser = SSEParser()
    events = parser.feed(b'{"choices": []}\n\nid: 1\nretry: 5\n: comment\ndata: x\n\n')
    events += parser.feed(b'{"choices": [1]}\n') + parser.finish()
    assert events == [SSEEvent(None, "x")]
    assert parser.unknown_lines == 2
    assert parser.first_unknown_line == '{"choices": []}'


def test_a_long_line_in_many_chunks_is_one_event() -> None:
    parser = SSEParser()
    pieces = [b"data: "] + [b"x" * 100] * 10_000 + [b"\n", b"\n"]
    events = [event for piece in pieces for event in parser.feed(piece)]
    assert events == [SSEEvent(None, "x" * 1_000_000)]
