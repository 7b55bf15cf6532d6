"""A client that leaves early is no error of the gateway's: one that hangs up while its
request body is read is logged at info level, with no traceback and no 5xx logged; one
that leaves a stream before its first byte has its record ``aborted``, never ``ok``."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import orjson
import pytest

from reef.experience import RecordFilter, RecordView
from tests.fakes.upstream import FakeUpstreamThread
from tests.gateway.harness import GatewayThread, make_settings
from tests.gateway.rawhttp import holds_connection, send_unread
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


STREAMS = [
    pytest.param(
        "/v1/chat/completions",
        {"model": "reef/support", "stream": True},
        id="openai",
    ),
    pytest.param(
        "/v1/messages",
        {"model": "reef/claude", "stream": True, "max_tokens": 50},
        id="anthropic",
    ),
    pytest.param(
        "/v1/messages",
        {"model": "reef/support", "stream": True, "max_tokens": 50},
        id="translated",
    ),
]


@pytest.fixture(scope="module", params=["2.3", "2.4"])
def either_gateway(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    fake: FakeUpstreamThread,
) -> Iterator[GatewayThread]:
    """A gateway served as an ASGI 2.3 server does (the disconnect comes on ``receive``)
    and as a 2.4 one does (a ``send`` to the gone client raises)."""
    home = tmp_path_factory.mktemp("gone")
    with GatewayThread(make_settings(home, fake.base_url), asgi_spec=request.param) as gateway:
        yield gateway


@pytest.mark.parametrize(("path", "request_body"), STREAMS)
def test_a_stream_left_before_its_first_byte_is_recorded_aborted(
    either_gateway: GatewayThread,
    fake: FakeUpstreamThread,
    path: str,
    request_body: dict[str, object],
) -> None:
    session = f"left-early-{path.rsplit('/', 1)[-1]}-{request_body['model']}".replace("/", "-")
    body = {**request_body, "messages": [{"role": "user", "content": "hold-answer please"}]}
    sock = send_unread(either_gateway.port, path, orjson.dumps(body), {"x-reef-session": session})
    client_port = sock.getsockname()[1]
    try:
        # The upstream holds its answer (headers and first chunk) until the client left
        # and the gateway has seen it go; only then does the whole stream arrive at once.
        eventually(lambda: fake.held == 1 or None, "the upstream holding the request")
        sock.close()
        eventually(
            lambda: not holds_connection(either_gateway.server, client_port) or None,
            "the gateway seeing the client go",
        )
        fake.release_held()
        scenario = str(request_body["model"]).removeprefix("reef/")
        filters = RecordFilter(session_id=session)

        def settled() -> RecordView | None:
            page = either_gateway.store.list_records(scenario, filters, None, 10)
            ended = [r for r in page.records if r.status != "pending"]
            return ended[0] if ended else None

        record = eventually(settled, "the stream's record to settle")
    finally:
        fake.reset()
    assert (record.status, record.error) == (
        "aborted",
        "client disconnected before the first byte",
    )
