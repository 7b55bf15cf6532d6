"""Relaying a stream to a Responses client while keeping the response for the record.

- ``ResponsesRelay``: a Responses client on an OpenAI-compatible upstream; chat chunks
  are translated into the Responses API's typed events (``reef.upstream.responses.stream``);
- ``AnthropicResponsesRelay``: a Responses client on the Anthropic API; events are
  turned into chat chunks, and those into the Responses API's typed events;
- ``NativeResponsesRelay``: an upstream's own Responses API stream
  (``upstreams.<u>.responses: native``), passed through but for two changes: each
  response object an event carries (``response.created``, ``response.in_progress``,
  the terminal event) gets Reef's response id, the one ``previous_response_id``
  continues on Reef; and the upstream's ``error`` event or its own ``response.failed``
  is a failure (``UpstreamError``).

As every relay (``reef.upstream.relay``), each holds back the terminal event
(``response.completed`` or ``response.incomplete``) until its caller sends it (the
gateway: once the record is committed), with the receipt as ``x_reef``. A failure ends
the client's stream with a ``response.failed`` naming it, and the record keeps the
failed response with what arrived.
"""

from __future__ import annotations

from typing import Any, Final

from reef.core import dumps
from reef.upstream.base import UpstreamError
from reef.upstream.canonical import canonical_reply_responses
from reef.upstream.chat_anthropic import AnthropicToOpenAIStream
from reef.upstream.relay import (
    SAMPLE_CHARS,
    OpenAIFinish,
    Result,
    StreamRelay,
    anthropic_stream_error,
    json_object,
)
from reef.upstream.responses.stream import OpenAIToResponsesStream
from reef.upstream.sse import encode_sse

_TERMINAL: Final = ("response.completed", "response.incomplete")


class ResponsesRelay(StreamRelay):
    """OpenAI chunks translated into Responses events for a Responses client; the
    record keeps the response object the client was sent."""

    _proper_end = "[DONE] and a finish_reason"

    def __init__(self, shell: dict[str, Any], receipt: dict[str, str] | None = None) -> None:
        super().__init__()
        self.translator = OpenAIToResponsesStream(shell)
        self.receipt = receipt  # the terminal event's ``x_reef`` (``stream_receipt``)
        self.finished = OpenAIFinish()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        parsed = self.finished.read(data)
        if parsed is not None:
            out.extend(_responses_event(*event) for event in self.translator.feed(parsed))

    def _ended(self) -> bool:
        return self.finished.done and self.translator.finish_reason is not None

    def _closing(self) -> bytes:
        *events, (name, payload) = self.translator.finish()
        self.terminal = _responses_event(name, self._receipted(payload))  # response.completed
        return b"".join(_responses_event(*event) for event in events)

    def failure(self, exc: UpstreamError, error_event: bytes) -> bytes:
        """``response.failed``, naming the failure (after the events not sent yet)."""
        *events, (name, payload) = self.translator.failed(exc.detail)
        failed = b"".join(_responses_event(*event) for event in events)
        return self._unsent + failed + _responses_event(name, self._receipted(payload))

    def _receipted(self, payload: dict[str, Any]) -> dict[str, Any]:
        return payload if self.receipt is None else {**payload, "x_reef": self.receipt}

    def result(self) -> Result:
        """The response sent so far (failed, once ``failure`` was sent) and its reply."""
        response = self.translator.result()
        return response, canonical_reply_responses(response)


class AnthropicResponsesRelay(ResponsesRelay):
    """Anthropic events translated into Responses events for a Responses client (by way
    of the chat chunks ``AnthropicToOpenAIStream`` makes of them); the record keeps the
    response object the client was sent."""

    _proper_end = "message_stop and a stop_reason"

    def __init__(self, shell: dict[str, Any], receipt: dict[str, str] | None = None) -> None:
        super().__init__(shell, receipt)
        self.chunks = AnthropicToOpenAIStream()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        if self.chunks.stopped:
            return  # nothing counts after message_stop
        parsed = json_object(data)
        name = event or str(parsed.get("type", ""))
        if name == "error":
            raise anthropic_stream_error(parsed, data)
        for chunk in self.chunks.feed(name, parsed):
            out.extend(_responses_event(*event) for event in self.translator.feed(chunk))

    def _ended(self) -> bool:
        return self.chunks.stopped and self.translator.finish_reason is not None


def _responses_event(name: str, payload: dict[str, Any]) -> bytes:
    return encode_sse(dumps(payload), name)


class NativeResponsesRelay(StreamRelay):
    """The upstream's Responses events passed through to a Responses client."""

    _proper_end = "response.completed or response.incomplete"

    def __init__(self, response_id: str, receipt: dict[str, str]) -> None:
        super().__init__()
        self.response_id = response_id
        self.receipt = receipt  # the terminal event's ``x_reef``
        self.response: dict[str, Any] = {}  # the latest response object seen
        self.items: dict[int, dict[str, Any]] = {}  # finished output items, by index
        self.sequence = -1
        self.ended = False

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        if self.ended:
            return  # nothing counts after the terminal event
        parsed = json_object(data)
        name = str(parsed.get("type") or event or "")
        sequence = parsed.get("sequence_number")
        if isinstance(sequence, int):
            self.sequence = max(self.sequence, sequence)
        if name == "error":
            raise UpstreamError(
                f"the upstream's stream failed: {parsed.get('code') or 'error'}: "
                f"{parsed.get('message') or data[:SAMPLE_CHARS]}"
            )
        response = parsed.get("response")
        if isinstance(response, dict):
            self.response = {**response, "id": self.response_id}
            parsed = {**parsed, "response": self.response}
        if name == "response.failed":
            error = self.response.get("error") or {}
            raise UpstreamError(
                f"the upstream's response failed: {error.get('code') or 'error'}: "
                f"{error.get('message') or 'no message'}"
            )
        if name == "response.output_item.done" and isinstance(parsed.get("item"), dict):
            index = parsed.get("output_index")
            self.items[index if isinstance(index, int) else len(self.items)] = parsed["item"]
        if name in _TERMINAL:
            self.ended = True
            self.terminal = encode_sse(dumps({**parsed, "x_reef": self.receipt}), event)
        elif isinstance(response, dict):
            out.append(encode_sse(dumps(parsed), event))
        else:
            out.append(encode_sse(data.encode(), event))  # untouched

    def _ended(self) -> bool:
        return self.ended

    def result(self) -> Result:
        """The response so far: the terminal event's, else the latest one seen with the
        output items finished so far (failed, once ``failure`` was sent)."""
        response = self.response
        if not self.ended and self.items:
            response = {**response, "output": [self.items[i] for i in sorted(self.items)]}
        return response, canonical_reply_responses(response)

    def failure(self, exc: UpstreamError, error_event: bytes) -> bytes:
        """``response.failed``, naming the failure (after the events not sent yet)."""
        partial, _ = self.result()
        self.response = {
            "id": self.response_id,
            "object": "response",
            **partial,
            "status": "failed",
            "error": {"code": "server_error", "message": exc.detail},
        }
        self.ended = True
        event = {
            "type": "response.failed",
            "sequence_number": self.sequence + 1,
            "response": self.response,
            "x_reef": self.receipt,
        }
        return self._unsent + encode_sse(dumps(event), "response.failed")
