"""Relaying an upstream's event stream to a client while reassembling it for the record.

One class per way a chat or messages stream reaches a client (the Responses API's are in
``reef.upstream.responses.relay``):

- ``OpenAIRelay``: an OpenAI client on an OpenAI-compatible upstream; events pass
  through, less the usage chunk the gateway asked for on the record's behalf;
- ``CompletionsRelay``: the same for a legacy text completion (``/v1/completions``);
- ``AnthropicRelay``: an Anthropic client on the Anthropic API; events pass through;
- ``TranslatedRelay``: an Anthropic client on an OpenAI-compatible upstream; chunks are
  translated into Anthropic events.

Each holds back the end-of-stream event (``terminal``) so that its caller sends it when
it chooses (the gateway: once the record is committed), and each knows what a proper
end of its stream is: OpenAI's ``[DONE]`` after a ``finish_reason`` on every choice,
Anthropic's ``message_stop``. A stream that ends otherwise is not passed off as
complete: ``feed`` and ``finish`` raise ``UpstreamTruncatedError`` (no proper end),
``UpstreamMalformedError`` (data that is not a JSON object, a body that is not an event
stream) or ``UpstreamError`` (the upstream's own error event), and the caller ends the
client's stream with ``failure`` instead of the terminal event. The error event a
failure sends is the caller's (the gateway's error document in the client's dialect,
``reef.gateway.errors.error_event``): a relay knows no HTTP status mapping.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import orjson

from reef.core import dumps
from reef.upstream.assemble import (
    AnthropicStreamAssembler,
    CompletionStreamAssembler,
    OpenAIStreamAssembler,
)
from reef.upstream.base import UpstreamError, UpstreamMalformedError, UpstreamTruncatedError
from reef.upstream.canonical import (
    canonical_reply_anthropic,
    canonical_reply_completions,
    canonical_reply_openai,
)
from reef.upstream.sse import SSEEvent, SSEParser, encode_sse
from reef.upstream.translate import OpenAIToAnthropicStream

Result = tuple[dict[str, Any], dict[str, Any]]
"""The reassembled response in the client's dialect and its canonical reply."""
SAMPLE_CHARS = 80
"""How much of an unreadable event an error message quotes."""


class StreamRelay(ABC):
    """Parses upstream SSE bytes, produces what the client gets, and keeps the record."""

    def __init__(self) -> None:
        self.parser = SSEParser()
        self.terminal = b""  # held back until the record is committed
        # Client events made from a read whose later event failed: a relay whose
        # ``failure`` can still deliver them sends them before its error event.
        self._unsent = b""

    def feed(self, chunk: bytes) -> bytes:
        """Client bytes for one upstream chunk (possibly empty); raises as the module
        says."""
        return self._relay(self.parser.feed(chunk))

    def finish(self) -> bytes:
        """At the upstream's end of stream: the events the client is still owed (the
        last one, should the upstream not have ended it with a blank line; a translated
        stream's closing events). Raises ``UpstreamTruncatedError`` or
        ``UpstreamMalformedError`` when the stream did not end properly."""
        out = self._relay(self.parser.finish())
        if not self._ended():
            if self.parser.unknown_lines:
                raise UpstreamMalformedError(
                    f"the upstream's stream is not Server-Sent Events: "
                    f"{self.parser.unknown_lines} unframed line(s) such as "
                    f"{self.parser.first_unknown_line!r}"
                )
            raise UpstreamTruncatedError(f"the stream ended before {self._proper_end}")
        return out + self._closing()

    def _relay(self, events: list[SSEEvent]) -> bytes:
        # The upstream's error may arrive in the same read as the events before it;
        # those are kept for ``failure`` (``_unsent``) instead of being lost.
        out: list[bytes] = []
        try:
            for event, data in events:
                if data:
                    self._event(event, data, out)
        except UpstreamError:
            self._unsent = b"".join(out)
            raise
        return b"".join(out)

    @abstractmethod
    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        """Handle one upstream event, appending what the client gets to ``out``."""

    _proper_end: str  # what the stream should have ended with, for the error message

    @abstractmethod
    def _ended(self) -> bool:
        """Whether the upstream ended its stream properly."""

    def _closing(self) -> bytes:
        """Events owed to the client after a proper end (none unless translated)."""
        return b""

    @abstractmethod
    def result(self) -> Result:
        """The reassembled response in the client's dialect and its canonical reply."""

    def failure(self, exc: UpstreamError, error_event: bytes) -> bytes:
        """What ends the client's stream when the upstream failed mid-way (after which
        ``result`` holds the failed response, where the dialect has one): the caller's
        ``error_event`` in the client's dialect, unless the dialect ends a failed stream
        its own way (a Responses stream's ``response.failed``)."""
        return error_event


class OpenAIRelay(StreamRelay):
    """OpenAI chunks passed through to an OpenAI client."""

    _proper_end = "[DONE] and a finish_reason"

    def __init__(self, strip_usage: bool) -> None:
        super().__init__()
        self.strip_usage = strip_usage  # usage was asked for by the gateway, not the client
        self.assembler: OpenAIStreamAssembler | CompletionStreamAssembler = OpenAIStreamAssembler()
        self.finished = OpenAIFinish()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        parsed = self.finished.read(data)
        if parsed is None:  # [DONE], the end; nothing counts after it
            self.terminal = b"data: [DONE]\n\n"
            return
        self.assembler.feed(parsed)
        if self.strip_usage and not parsed.get("choices") and parsed.get("usage"):
            return
        out.append(encode_sse(data.encode(), None))

    def _ended(self) -> bool:
        return self.finished.ended()

    def result(self) -> Result:
        """The chat.completion received so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_openai(response)


class CompletionsRelay(OpenAIRelay):
    """A legacy text completion's chunks passed through to an OpenAI client: they end
    as chat chunks do (a ``finish_reason`` per choice, then ``[DONE]``)."""

    def __init__(self, strip_usage: bool, request: dict[str, Any] | None) -> None:
        super().__init__(strip_usage)
        self.assembler = CompletionStreamAssembler()
        self.request = request  # its ``echo`` puts the prompt before the reply

    def result(self) -> Result:
        """The text_completion received so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_completions(response, self.request)


class AnthropicRelay(StreamRelay):
    """Anthropic events passed through to an Anthropic client."""

    _proper_end = "message_stop"

    def __init__(self) -> None:
        super().__init__()
        self.assembler = AnthropicStreamAssembler()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        if self.terminal:
            return  # nothing counts after message_stop
        parsed = json_object(data)
        name = event or str(parsed.get("type", ""))
        if name == "error":
            raise anthropic_stream_error(parsed, data)
        self.assembler.feed(name, parsed)
        if name == "message_stop":
            self.terminal = encode_sse(data.encode(), event)
        else:
            out.append(encode_sse(data.encode(), event))

    def _ended(self) -> bool:
        return bool(self.terminal)

    def result(self) -> Result:
        """The message received so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_anthropic(response)


class TranslatedRelay(StreamRelay):
    """OpenAI chunks translated into Anthropic events for an Anthropic client; the
    record keeps the message the client was sent."""

    _proper_end = "[DONE] and a finish_reason"

    def __init__(self, client_model: str) -> None:
        super().__init__()
        self.assembler = AnthropicStreamAssembler()
        self.translator = OpenAIToAnthropicStream(client_model)
        self.finished = OpenAIFinish()

    def _event(self, event: str | None, data: str, out: list[bytes]) -> None:
        parsed = self.finished.read(data)
        if parsed is not None:
            self._send(self.translator.feed(parsed), out)

    def _send(self, events: list[tuple[str, dict[str, Any]]], out: list[bytes]) -> None:
        for name, payload in events:
            self.assembler.feed(name, payload)
            if name == "message_stop":
                self.terminal = encode_sse(dumps(payload), name)
            else:
                out.append(encode_sse(dumps(payload), name))

    def _ended(self) -> bool:
        # The translator gives the first choice's stop reason; the others are dropped.
        return self.finished.done and self.translator.stop_reason is not None

    def _closing(self) -> bytes:
        out: list[bytes] = []
        self._send(self.translator.finish(), out)
        return b"".join(out)

    def result(self) -> Result:
        """The message sent so far and its canonical reply."""
        response = self.assembler.result()
        return response, canonical_reply_anthropic(response)


def anthropic_stream_error(parsed: dict[str, Any], data: str) -> UpstreamError:
    """The failure an Anthropic stream's ``error`` event reports."""
    error = parsed.get("error")
    detail = error if isinstance(error, dict) else parsed
    return UpstreamError(
        f"the upstream's stream failed: {detail.get('type', 'error')}: "
        f"{detail.get('message', data[:SAMPLE_CHARS])}"
    )


class OpenAIFinish:
    """Whether an OpenAI stream ended properly: ``[DONE]``, after a ``finish_reason``
    for every choice that appeared (and at least one did)."""

    def __init__(self) -> None:
        self.done = False
        self.open: set[int] = set()  # choices seen without their finish_reason yet
        self.finished: set[int] = set()

    def read(self, data: str) -> dict[str, Any] | None:
        """The chunk an event's ``data`` holds, counted (``feed``); None for ``[DONE]``
        and for anything after it. Raises as ``openai_chunk``."""
        if self.done:
            return None
        if data == "[DONE]":
            self.done = True
            return None
        chunk = openai_chunk(data)
        self.feed(chunk)
        return chunk

    def feed(self, chunk: dict[str, Any]) -> None:
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if choice.get("finish_reason"):
                self.open.discard(index)
                self.finished.add(index)
            elif index not in self.finished:
                self.open.add(index)

    def ended(self) -> bool:
        return self.done and bool(self.finished) and not self.open


def json_object(data: str) -> dict[str, Any]:
    """An event's data as a JSON object; raises ``UpstreamMalformedError``."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamMalformedError(
            f"the upstream sent an event whose data is not JSON ({exc}): {data[:SAMPLE_CHARS]!r}"
        ) from exc
    if not isinstance(parsed, dict):
        raise UpstreamMalformedError(
            f"the upstream sent an event whose data is not a JSON object: {data[:SAMPLE_CHARS]!r}"
        )
    return parsed


def openai_chunk(data: str) -> dict[str, Any]:
    """A chat.completion.chunk; raises ``UpstreamMalformedError``, or ``UpstreamError``
    for the error object a server sends mid-stream (vLLM, OpenAI)."""
    parsed = json_object(data)
    error = parsed.get("error")
    if error is not None and not parsed.get("choices"):
        message = error.get("message") if isinstance(error, dict) else error
        raise UpstreamError(f"the upstream's stream failed: {message}")
    return parsed
