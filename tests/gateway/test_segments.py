"""A complete answer leaves in one TCP segment (``reef.gateway.segments``): a client's
first read after its request holds the status line, the headers and the whole body."""

from __future__ import annotations

import json
import socket

from reef.gateway.segments import one_segment
from tests.gateway.harness import GatewayThread

BODY = json.dumps(
    {"model": "reef/support", "messages": [{"role": "user", "content": "one segment"}]}
).encode()
REQUEST = (
    "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
    f"content-type: application/json\r\ncontent-length: {len(BODY)}\r\n\r\n"
).encode() + BODY


def first_read(sock: socket.socket) -> bytes:
    """What one ``recv`` returns after the request is sent."""
    sock.sendall(REQUEST)
    return sock.recv(1 << 20)


def test_headers_and_body_arrive_in_one_read(gateway: GatewayThread) -> None:
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        for _ in range(20):  # on one keep-alive connection, as SDKs send them
            data = first_read(sock)
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:80]
            lengths = [
                line.split(b":", 1)[1].strip()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            assert len(body) == int(lengths[0]), "the body came in a later segment"
            assert json.loads(body)["object"] == "chat.completion"


async def test_without_a_tcp_socket_the_answer_goes_out_as_it_is() -> None:
    sent: list[object] = []

    async def send(message: object) -> None:  # a plain callable: no transport behind it
        sent.append(message)

    with one_segment(send):
        await send({"type": "http.response.start"})
    assert sent == [{"type": "http.response.start"}]
