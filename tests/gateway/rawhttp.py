"""Raw HTTP calls for cases the SDKs cannot produce (malformed bodies, odd headers)."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    port: int,
    method: str,
    path: str,
    body: bytes | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> RawResponse:
    """One request on a fresh connection."""
    payload = json.dumps(body).encode() if isinstance(body, dict) else body
    sent = {"content-type": "application/json", **(headers or {})}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, payload, sent)
        response = conn.getresponse()
        return RawResponse(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()
