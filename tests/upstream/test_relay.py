"""The chat and messages relays (``reef.upstream.relay``): a failed stream ends with the
error event its caller gives, in the client's dialect; the relay knows no error document."""

from __future__ import annotations

import orjson
import pytest

from reef.gateway.errors import ErrorDialect, error_event
from reef.upstream import UpstreamError
from reef.upstream.relay import AnthropicRelay, OpenAIRelay

CALLERS_EVENT = b"data: the caller's error event\n\n"


def test_an_openai_stream_that_fails_ends_with_the_callers_error_event() -> None:
    relay = OpenAIRelay(strip_usage=False)
    chunk = {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}
    assert relay.feed(b"data: " + orjson.dumps(chunk) + b"\n\n").startswith(b"data: ")
    error = {"error": {"message": "overloaded", "type": "server_error", "code": 503}}
    with pytest.raises(UpstreamError) as info:
        relay.feed(b"data: " + orjson.dumps(error) + b"\n\n")
    assert relay.failure(info.value, CALLERS_EVENT) == CALLERS_EVENT
    response, _ = relay.result()
    assert response["choices"][0]["message"]["content"] == "Hel"  # what arrived


def test_an_anthropic_stream_that_fails_ends_with_the_callers_error_event() -> None:
    relay = AnthropicRelay()
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    with pytest.raises(UpstreamError, match="overloaded_error: busy") as info:
        relay.feed(b"event: error\ndata: " + orjson.dumps(error) + b"\n\n")
    assert relay.failure(info.value, CALLERS_EVENT) == CALLERS_EVENT


@pytest.mark.parametrize(
    ("dialect", "head", "kind"),
    [("openai", b"data: ", "upstream_error"), ("anthropic", b"event: error\ndata: ", "api_error")],
)
def test_the_gateways_error_event_is_in_the_clients_dialect(
    dialect: ErrorDialect, head: bytes, kind: str
) -> None:
    failure = UpstreamError("the upstream's stream failed: cut")
    sent = error_event(failure, dialect)
    assert sent.startswith(head) and sent.endswith(b"\n\n")
    body = orjson.loads(sent[len(head) :])
    assert body["error"]["type"] == kind
    assert body["error"]["message"] == failure.detail
