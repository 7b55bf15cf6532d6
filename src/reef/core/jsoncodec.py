"""Fast JSON (orjson) and canonical JSON for digests."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    """Serialize to compact UTF-8 JSON bytes."""
    return orjson.dumps(value)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON; raises ``orjson.JSONDecodeError`` (a ``ValueError``) on bad input."""
    return orjson.loads(data)


def canonical_json(value: Any) -> bytes:
    """JSON with sorted keys: equal values always give equal bytes."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
