"""A client that leaves early is no error of the gateway's: one that hangs up while its
request body is read is logged at info level, with no traceback and no 5xx logged."""

from __future__ import annotations

import logging
import socket

import pytest

from tests.gateway.harness import GatewayThread
from tests.polling import eventually

GONE = "client went away while its request was read"


def hang_up_mid_body(port: int, path: str) -> None:
    """Announce a 1000-byte JSON body, send 10 bytes of it, and close the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = [
            f"POST {path} HTTP/1.1",
            "host: 127.0.0.1",
            "content-type: application/json",
            "content-length: 1000",
        ]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b'{"model":"')


@pytest.mark.parametrize(
    "path",
    ["/v1/chat/completions", "/v1/messages", "/reef/feedback", "/reef/scenarios/support/promote"],
)
def test_a_hang_up_during_the_body_read_is_logged_at_info_without_a_traceback(
    module_gateway: GatewayThread, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    with caplog.at_level(logging.INFO):
        hang_up_mid_body(module_gateway.port, path)
        eventually(
            lambda: [r for r in caplog.records if GONE in r.getMessage()] or None,
            f"the info line for the hang-up on {path}",
        )
    gone = [r for r in caplog.records if GONE in r.getMessage()]
    assert [(r.levelno, r.getMessage().rpartition(" ")[2]) for r in gone] == [(logging.INFO, path)]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
