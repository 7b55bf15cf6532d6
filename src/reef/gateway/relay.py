"""Relaying an upstream's event stream to the client while reassembling it for the record.

One class per way a stream reaches a client:

- ``OpenAIRelay``: an OpenAI client on an OpenAI-compatible upstream; events pass
  through, less the usage chunk the gateway asked for on the record's behalf;
- ``AnthropicRelay``: an Anthropic client on the Anthropic API; events pass through;
- ``TranslatedRelay``: an Anthropic client on an OpenAI-compatible upstream; chunks are
  translated into Anthropic events.

Each holds back the end-of-stream event (``terminal``) so that the gateway sends it
only once the record is committed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import orjson

from reef.core import dumps
from reef.gateway.capture import Api
from reef.gateway.errors import ErrorDialect, error_body
from reef.upstream import (
    AnthropicStreamAssembler,
    OpenAIStreamAssembler,
    OpenAIToAnthropicStream,
    SSEParser,
    UpstreamError,
    canonical_reply_anthropic,
    canonical_reply_openai,
    encode_sse,
)

Result = tuple[dict[str, Any], dict[str, Any]]


class StreamRelay(ABC):
    """Parses upstream SSE bytes, produces what the client gets, and keeps the record."""

    def __init__(self) -> None:
        self.parser = SSEParser()
        self.terminal = b""  # held back until the record is committed

    def feed(self, chunk: bytes) -> bytes:
        """Client bytes for one upstream chunk (possibly empty)."""
        out: list[bytes] = []
        for event, data in self.parser.feed(chunk):
            if data:
                self._event(event, data, out)
        return b"".join(out)

    @abstractmethod
    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        """Handle one upstream event, appending what the client gets to ``out``."""

    def finish(self) -> bytes:
        """Closing events the stream still owes the client (none unless translated)."""
        return b""

    @abstractmethod
    def result(self) -> Result:
        """The reassembled response in the client's dialect and its canonical reply."""


class OpenAIRelay(StreamRelay):
    """OpenAI chunks passed through to an OpenAI client."""

    def __init__(self, strip_usage: bool) -> None:
        super().__init__()
        self.strip_usage = strip_usage  # usage was asked for by the gateway, not the client
        self.assembler = OpenAIStreamAssembler()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        if data == "[DONE]":
            self.terminal = b"data: [DONE]\n\n"
            return
        parsed = orjson.loads(data)
        self.assembler.feed(parsed)
        if self.strip_usage and not parsed.get("choices") and parsed.get("usage"):
            return
        out.append(encode_sse(data.encode(), None))

    def result(self) -> Result:
        """The chat.completion received so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_openai(response)


class AnthropicRelay(StreamRelay):
    """Anthropic events passed through to an Anthropic client."""

    def __init__(self) -> None:
        super().__init__()
        self.assembler = AnthropicStreamAssembler()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        parsed = orjson.loads(data)
        name = event or parsed.get("type", "")
        self.assembler.feed(name, parsed)
        if name == "message_stop":
            self.terminal = encode_sse(data.encode(), event)
        else:
            out.append(encode_sse(data.encode(), event))

    def result(self) -> Result:
        """The message received so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_anthropic(response)


class TranslatedRelay(StreamRelay):
    """OpenAI chunks translated into Anthropic events for an Anthropic client; the
    record keeps the message the client was sent."""

    def __init__(self, client_model: str) -> None:
        super().__init__()
        self.assembler = AnthropicStreamAssembler()
        self.translator = OpenAIToAnthropicStream(client_model)

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        if data == "[DONE]":
            return
        parsed = orjson.loads(data)
        self._send(self.translator.feed(parsed), out)

    def _send(self, events: list[tuple[str, dict[str, Any]]], out: list[bytes]) -> None:
        for name, payload in events:
            self.assembler.feed(name, payload)
            if name == "message_stop":
                self.terminal = encode_sse(dumps(payload), name)
            else:
                out.append(encode_sse(dumps(payload), name))

    def finish(self) -> bytes:
        """The closing events of the translated stream."""
        out: list[bytes] = []
        self._send(self.translator.finish(), out)
        return b"".join(out)

    def result(self) -> Result:
        """The message sent so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_anthropic(response)


def open_relay(api: Api, *, translate: bool, strip_usage: bool, client_model: str) -> StreamRelay:
    """The relay for a stream of ``api`` (``translate``: an Anthropic client on an
    OpenAI-compatible upstream)."""
    if api == "openai.chat":
        return OpenAIRelay(strip_usage)
    if translate:
        return TranslatedRelay(client_model)
    return AnthropicRelay()


def error_event(exc: UpstreamError, dialect: ErrorDialect) -> bytes:
    """The error a stream ends with when the upstream fails mid-way."""
    body = error_body(exc.status, exc.message, dialect)
    return encode_sse(body, "error" if dialect == "anthropic" else None)
