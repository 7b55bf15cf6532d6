"""Fast JSON (orjson) and canonical JSON for digests, and the one nesting limit."""

from __future__ import annotations

import hashlib
from typing import Any, Final

import orjson

MAX_DEPTH: Final = 128
"""The deepest nesting of arrays and objects Reef accepts in a document from a client.

orjson parses 1024 levels but writes only 254, and Reef writes a client's document a few
levels deeper than it came (inside a record, a translated request, an export line). So a
document is refused when parsed past this limit, half of what can be written, and every
document accepted can be written back wherever Reef nests it. ``tests/core`` checks that
orjson still writes this many levels with that headroom.
"""

WRITE_HEADROOM: Final = 254 - MAX_DEPTH
"""Levels Reef may wrap around an accepted document and still write it."""


def dumps(value: Any) -> bytes:
    """Serialize to compact UTF-8 JSON bytes."""
    return orjson.dumps(value)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; raises ``orjson.JSONDecodeError`` (a ``ValueError``) on bad input."""
    return orjson.loads(data)


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value``, as parsed from JSON, nests arrays and objects more than ``limit``
    levels (a scalar is 0 levels, ``[]`` and ``{"a": 1}`` are 1). Walks level by level,
    visiting each array and object once, and stops at the first level past ``limit``."""
    containers: list[Any] = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while containers:
        depth += 1
        if depth > limit:
            return True
        inner: list[Any] = []
        add = inner.append
        for container in containers:
            # Exact type checks: a parser makes plain dicts and lists, and isinstance
            # against both doubles the cost of this walk on long conversations.
            for item in container.values() if type(container) is dict else container:
                if type(item) is dict or type(item) is list:
                    add(item)
        containers = inner
    return False


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys: equal values always give equal bytes."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
