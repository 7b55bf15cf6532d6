"""OTLP protobuf bytes of spans, written field by field (no OpenTelemetry import).

The export process encodes each batch of span descriptions (``reef.telemetry.live``) as
one ``ExportTraceServiceRequest`` here and hands the bytes to the SDK's OTLP exporter for
transport. Going through SDK ``Span`` objects, the batch processor and the SDK's encoder
cost about 240 µs of CPU per span on the benchmark machine; this costs a tenth of that
(``bench/otel_export.py``). Field numbers are those of ``opentelemetry/proto`` (trace v1,
common v1, resource v1); ``tests/telemetry/test_otlp_proto.py`` parses the output with
``opentelemetry-proto`` and compares it with the SDK's own encoding.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

# Span.SpanKind and Status.StatusCode values.
KINDS = {"internal": 1, "server": 2, "client": 3}
STATUS_ERROR = 2
_DOUBLE = struct.Struct("<d")
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
# Span and Link ``flags`` as the SDK's encoder writes them: whether the parent (the
# link) is remote is known, and it is (Reef's parents and links are records' spans).
_LOCAL_PARENT = b"\x85\x01" + _FIXED32.pack(0x100)
_REMOTE_PARENT = b"\x85\x01" + _FIXED32.pack(0x300)
_REMOTE_LINK = b"\x35" + _FIXED32.pack(0x300)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length(size: int) -> bytes:
    return bytes((size,)) if size < 0x80 else _varint(size)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _tag(number, 2) + _length(len(payload)) + payload


@lru_cache(maxsize=64)
def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _text(number: int, value: str) -> bytes:
    return _field(number, value.encode())


def any_value(value: Any) -> bytes:
    """An ``AnyValue`` message: str, bool, int, float, or a sequence of them."""
    if isinstance(value, str):
        return _text(1, value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64, two's complement
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, Sequence):
        return _field(5, b"".join(_field(1, any_value(item)) for item in value))
    raise TypeError(f"an OTLP attribute cannot hold {type(value).__name__}")


@lru_cache(maxsize=512)
def _key(key: str) -> bytes:
    return _text(1, key)


def _pair(number: int, key: str, value: Any) -> bytes:
    return _field(number, _key(key) + _field(2, any_value(value)))


# Most attributes repeat from span to span (operation, provider, model, scenario, status,
# token counts): their encoded KeyValue is kept (``typed``: True, 1 and 1.0 differ).
_cached_pair = lru_cache(maxsize=8192, typed=True)(_pair)


_ONE_BYTE = [bytes((size,)) for size in range(0x80)]
_ATTRIBUTE_PREFIXES: dict[str, bytes] = {}  # key -> its KeyValue.key field, AnyValue's tag


def text_attribute(key: str, value: str) -> bytes:
    """A span's attribute (``Span`` field 9) of a str value: the bytes ``key_values(9,
    {key: value})`` writes, without its cache (for values that do not repeat)."""
    data = value.encode()
    prefix = _ATTRIBUTE_PREFIXES.get(key)
    if prefix is None:
        prefix = _ATTRIBUTE_PREFIXES[key] = _key(key) + b"\x12"
    size = len(data)
    pair_size = len(prefix) + 3 + size
    if pair_size < 0x80:  # every length fits one byte (the common case: ids)
        one = _ONE_BYTE
        return b"".join((b"\x4a", one[pair_size], prefix, one[size + 2], b"\x0a", one[size], data))
    value_field = b"\x0a" + _length(len(data)) + data
    pair = _key(key) + b"\x12" + _length(len(value_field)) + value_field
    return b"\x4a" + _length(len(pair)) + pair


def key_values(number: int, attributes: Mapping[str, Any]) -> bytes:
    """``attributes`` as repeated ``KeyValue`` field ``number``."""
    return b"".join(
        [
            _pair(number, key, value)
            if isinstance(value, list | tuple)
            else _cached_pair(number, key, value)
            for key, value in attributes.items()
        ]
    )


def _span_id(ids: Sequence[str] | None, size: int, position: int) -> bytes:
    if ids is None:
        return os.urandom(size)
    return bytes.fromhex(ids[position])


def span(description: Mapping[str, Any]) -> bytes:
    """A ``Span`` message of one span description: ``name``, ``kind``, ``start``/``end``
    (ns), ``attributes``, optional ``ids`` / ``parent`` / ``links`` (hex pairs),
    ``events`` (``[name, attributes]``, at the end time) and ``error``."""
    ids = description.get("ids")
    parent = description.get("parent")
    trace_id = _span_id(ids or parent, 16, 0)
    end = _FIXED64.pack(description["end"])
    parts = [
        _field(1, trace_id),
        _field(2, _span_id(ids, 8, 1)),
        _field(4, bytes.fromhex(parent[1])) if parent else b"",
        _text(5, description["name"]),
        b"\x30" + _varint(KINDS[description["kind"]]),
        b"\x39" + _FIXED64.pack(description["start"]),
        b"\x41" + end,
        key_values(9, description["attributes"]),
    ]
    for name, attributes in description.get("events") or ():
        parts.append(_field(11, b"\x09" + end + _text(2, name) + key_values(3, attributes)))
    for link in description.get("links") or ():
        link_ids = bytes.fromhex(link[0]), bytes.fromhex(link[1])
        parts.append(_field(13, _field(1, link_ids[0]) + _field(2, link_ids[1]) + _REMOTE_LINK))
    error = description.get("error")
    if error is not None:
        parts.append(_field(15, _text(2, str(error)) + b"\x18" + _varint(STATUS_ERROR)))
    else:
        parts.append(b"\x7a\x00")  # an empty (UNSET) status, as the SDK writes it
    parts.append(_REMOTE_PARENT if parent else _LOCAL_PARENT)  # field 16, fixed32
    return b"".join(parts)


def name_field(name: str) -> bytes:
    """A span's ``name`` (field 5)."""
    return _text(5, name)


def text_heads(key: str) -> list[bytes]:
    """What ``text_attribute(key, value)`` writes before the value's UTF-8 bytes, by
    their length, for the lengths whose every size fits one byte (index = length):
    a str attribute is then ``heads[len(data)] + data``."""
    prefix = _key(key) + b"\x12"
    return [
        b"".join((b"\x4a", _ONE_BYTE[len(prefix) + 3 + size], prefix, _ONE_BYTE[size + 2]))
        + b"\x0a"
        + _ONE_BYTE[size]
        for size in range(0x80 - 3 - len(prefix))
    ]


def int_attribute(key: str, value: int) -> bytes:
    """A span's attribute (``Span`` field 9) of an int value, uncached: the bytes
    ``key_values(9, {key: value})`` writes."""
    return _pair(9, key, value)


def status_error(message: str) -> bytes:
    """A span's ``Status`` (field 15) of code ERROR with ``message``."""
    return _field(15, _text(2, message) + b"\x18" + _varint(STATUS_ERROR))


STATUS_UNSET = b"\x7a\x00"  # an empty (UNSET) status, as the SDK writes it
LOCAL_PARENT = _LOCAL_PARENT  # a span's ``flags`` (field 16) without a parent


def export_request(
    spans: Iterable[bytes], resource: Mapping[str, Any], scope: str, scope_version: str = ""
) -> bytes:
    """An ``ExportTraceServiceRequest`` of encoded ``spans``, under one resource and one
    instrumentation scope."""
    return framed_request(spans, request_head(resource, scope, scope_version))


def request_head(
    resource: Mapping[str, Any], scope: str, scope_version: str = ""
) -> tuple[bytes, bytes]:
    """The encoded ``Resource`` (``ResourceSpans`` field 1) and ``InstrumentationScope``
    (``ScopeSpans`` field 1) that ``framed_request`` puts around its spans: encoded once
    per export process, not once per request."""
    scope_message = _text(1, scope) + (_text(2, scope_version) if scope_version else b"")
    return _field(1, key_values(1, resource)), _field(1, scope_message)


def framed_request(spans: Iterable[bytes], head: tuple[bytes, bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` of encoded ``spans`` under ``head``
    (``request_head``): each span's tag and length, then the lengths around them, in
    one join."""
    resource, scope = head
    tags = _SPAN_TAGS
    parts = [b"", b"", scope]  # the ResourceSpans' and the ScopeSpans' tag and length
    size = len(scope)
    for item in spans:
        length = len(item)
        tag = tags.get(length)
        if tag is None:
            tag = _span_tag(length)
        parts += (tag, item)
        size += len(tag) + length
    scope_spans = b"\x12" + _varint(size)
    parts[0] = b"\x0a" + _varint(len(resource) + len(scope_spans) + size) + resource
    parts[1] = scope_spans
    return b"".join(parts)


# A span's tag and length (``ScopeSpans`` field 2), by its length: spans of a batch are
# of few lengths. Bounded: full, it starts afresh.
_SPAN_TAGS: dict[int, bytes] = {}


def _span_tag(length: int) -> bytes:
    if len(_SPAN_TAGS) >= 4096:
        _SPAN_TAGS.clear()
    tag = _SPAN_TAGS[length] = b"\x12" + _varint(length)
    return tag
