"""Raw HTTP calls for cases the SDKs cannot produce (malformed bodies, odd headers)."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

import uvicorn


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
    json_default: bool = True,
) -> RawResponse:
    """One request on a fresh connection; ``Content-Type: application/json`` unless
    ``headers`` name another or ``json_default`` is false (exactly ``headers`` are sent)."""
    payload = json.dumps(body).encode() if isinstance(body, dict) else body
    default = {"content-type": "application/json"} if json_default else {}
    sent = {**default, **(headers or {})}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, payload, sent)
        response = conn.getresponse()
        return RawResponse(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        conn.close()


def send_unread(port: int, path: str, body: bytes, headers: dict[str, str]) -> socket.socket:
    """Send a POST and leave its answer unread: the caller closes the socket to play a
    client that goes away."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"content-length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def holds_connection(server: uvicorn.Server, client_port: int) -> bool:
    """Whether ``server`` still has a connection from ``127.0.0.1:client_port`` (it
    drops one as soon as it sees the client close it)."""
    connections = server.server_state.connections
    return any(getattr(c, "client", None) == ("127.0.0.1", client_port) for c in connections)
