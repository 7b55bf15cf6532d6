"""Relaying an upstream's own Responses API stream (``upstreams.<u>.responses: native``)
to a Responses client while keeping the response for the record.

The events pass through as the upstream sent them, but for two changes: each response
object an event carries (``response.created``, ``response.in_progress``, the terminal
event) gets Reef's response id, the one ``previous_response_id`` continues on Reef; and
the terminal event (``response.completed`` or ``response.incomplete``) is held back until
the record is committed, then sent with the receipt as ``x_reef``, as a translated
stream's is. The upstream's ``error`` event or its own ``response.failed`` is a failure
(``UpstreamError``): the client's stream ends with a ``response.failed`` naming it, and
the record is an ``error`` holding what arrived.
"""

from __future__ import annotations

from typing import Any, Final

from reef.core import dumps
from reef.gateway.errors import ErrorDialect
from reef.gateway.relay import Result, StreamRelay, json_object
from reef.upstream import UpstreamError, canonical_reply_responses, encode_sse

_TERMINAL: Final = ("response.completed", "response.incomplete")
_SAMPLE_CHARS = 80


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
                f"{parsed.get('message') or data[:_SAMPLE_CHARS]}"
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

    def failure(self, exc: UpstreamError, dialect: ErrorDialect) -> bytes:
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
