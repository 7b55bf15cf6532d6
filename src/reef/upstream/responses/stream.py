"""The typed event stream of the OpenAI Responses API, from chat.completion.chunk objects
(``OpenAIToResponsesStream``) or from a finished response (``response_events``, for
answers replayed from a record).

A stream opens with ``response.created`` and ``response.in_progress``; each output item
is announced (``response.output_item.added``), filled (a message's
``response.content_part.added`` and ``response.output_text.delta`` events, a function
call's ``response.function_call_arguments.delta``), finished (``….done`` events, then
``response.output_item.done``), and the stream ends with ``response.completed`` (or
``response.incomplete`` at the token limit), or ``response.failed`` when the upstream
fails. Every event carries its ``sequence_number``. Only the first choice is streamed.
"""

from __future__ import annotations

from typing import Any

from reef.upstream.base import UpstreamTruncatedError
from reef.upstream.responses.translate import (
    finished,
    function_call_item,
    item_id,
    output_text_part,
)

Event = tuple[str, dict[str, Any]]


class _Item:
    """One output item while it streams: the item and the pieces of its text or
    arguments (joined once, at its end)."""

    __slots__ = ("done", "item", "pieces")

    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self.pieces: list[str] = []
        self.done = False

    def final(self, status: str) -> dict[str, Any]:
        text = "".join(self.pieces)
        if self.item["type"] == "message":
            return {**self.item, "status": status, "content": [output_text_part(text)]}
        return {**self.item, "status": "completed", "arguments": text}


class ResponsesEventWriter:
    """Numbers and builds the events of one response stream on ``shell`` (the response
    object before any output: ``reef.upstream.responses.translate.response_shell``)."""

    def __init__(self, shell: dict[str, Any]) -> None:
        self.shell = shell
        self.items: list[_Item] = []
        self._sequence = 0
        self._text: int | None = None  # output index of the message being written

    def event(self, kind: str, **fields: Any) -> Event:
        """The next event of type ``kind``."""
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return kind, payload

    def start(self) -> list[Event]:
        """``response.created`` and ``response.in_progress``."""
        response = {**self.shell, "status": "in_progress", "output": [], "usage": None}
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def text(self, delta: str, msg_id: str | None = None) -> list[Event]:
        """A text delta, opening a message item (``msg_id``: its id, else a fresh one)
        first when none is being written."""
        events: list[Event] = []
        if self._text is None:
            events += self.close_all()
            item = {
                "id": msg_id or item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            self._text = self._open(item, events)
            events.append(
                self.event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._text,
                    content_index=0,
                    part=output_text_part(""),
                )
            )
        state = self.items[self._text]
        state.pieces.append(delta)
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=state.item["id"],
                output_index=self._text,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def open_call(
        self, call_id: str, name: str, fc_id: str | None = None
    ) -> tuple[int, list[Event]]:
        """A function-call item (ending the message being written); its output index."""
        events = self._close_text()
        item = function_call_item(call_id, name, "", "in_progress", fc_id)
        return self._open(item, events), events

    def arguments(self, index: int, delta: str) -> list[Event]:
        """An arguments delta of the function call at ``index``."""
        state = self.items[index]
        state.pieces.append(delta)
        if state.done:  # a late delta of a call already finished: kept, not sent
            return []
        return [
            self.event(
                "response.function_call_arguments.delta",
                item_id=state.item["id"],
                output_index=index,
                delta=delta,
            )
        ]

    def close_all(self, status: str = "completed") -> list[Event]:
        """Finish every item still open, in output order."""
        events: list[Event] = []
        for index in range(len(self.items)):
            events += self._close(index, status)
        self._text = None
        return events

    def end(self, finish_reason: str | None, usage: dict[str, Any] | None) -> Event:
        """The closing ``response.completed`` (or ``response.incomplete``) event; every
        item must be closed."""
        response = self.response(finish_reason, usage)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        return self.event(kind, response=response)

    def failed(self, message: str, code: str = "server_error") -> Event:
        """``response.failed`` with the output so far and the error."""
        response = {
            **self.snapshot(),
            "status": "failed",
            "error": {"code": code, "message": message},
        }
        return self.event("response.failed", response=response)

    def response(self, finish_reason: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
        """The finished response object."""
        output = [state.item if state.done else state.final("completed") for state in self.items]
        return finished(self.shell, output, finish_reason, usage)

    def snapshot(self) -> dict[str, Any]:
        """The response so far (``in_progress``): for the record of a cut stream."""
        output = [state.item if state.done else state.final("in_progress") for state in self.items]
        return {**self.shell, "status": "in_progress", "output": output}

    def _open(self, item: dict[str, Any], events: list[Event]) -> int:
        index = len(self.items)
        self.items.append(_Item(item))
        events.append(self.event("response.output_item.added", output_index=index, item=item))
        return index

    def _close_text(self) -> list[Event]:
        if self._text is None:
            return []
        index, self._text = self._text, None
        return self._close(index, "completed")

    def _close(self, index: int, status: str) -> list[Event]:
        state = self.items[index]
        if state.done:
            return []
        state.done = True
        state.item = state.final(status)
        item = state.item
        if item["type"] == "message":
            part = item["content"][0]
            events = [
                self.event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    logprobs=[],
                ),
                self.event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part=part,
                ),
            ]
        else:
            events = [
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            ]
        events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events


class OpenAIToResponsesStream:
    """Turns chat.completion.chunk objects into Responses events, one chunk at a time.

    Text opens a message item; each tool call its own function-call item as its first
    delta arrives (a text item open then is finished first). Tool-call items stay open
    until the end, so a server interleaving parallel calls' deltas still streams each
    under its own item.
    """

    def __init__(self, shell: dict[str, Any]) -> None:
        self.writer = ResponsesEventWriter(shell)
        self._started = False
        self._calls: dict[int, int] = {}  # chat tool-call index → output index
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None

    @property
    def finish_reason(self) -> str | None:
        """The first choice's ``finish_reason``; ``None`` until it arrives."""
        return self._finish_reason

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """Events for one chunk (the first call also yields the opening events)."""
        events: list[Event] = []
        if not self._started:
            self._started = True
            events += self.writer.start()
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for key in ("content", "refusal"):
                if delta.get(key):
                    events += self.writer.text(delta[key])
            for call in delta.get("tool_calls") or ():
                events += self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
        return events

    def _tool_call(self, call: dict[str, Any]) -> list[Event]:
        position = call.get("index", 0)
        function = call.get("function") or {}
        events: list[Event] = []
        index = self._calls.get(position)
        if index is None:
            index, events = self.writer.open_call(call.get("id") or "", function.get("name", ""))
            self._calls[position] = index
        elif function.get("name"):
            self.writer.items[index].item["name"] += function["name"]
        if function.get("arguments"):
            events += self.writer.arguments(index, function["arguments"])
        return events

    def finish(self) -> list[Event]:
        """The closing events, the last one ``response.completed`` (or
        ``response.incomplete``). Raises ``UpstreamTruncatedError`` when no
        ``finish_reason`` arrived: the stream was cut short."""
        if self._finish_reason is None:
            raise UpstreamTruncatedError("the stream ended before a finish_reason")
        events: list[Event] = []
        if not self._started:
            self._started = True
            events += self.writer.start()
        status = "incomplete" if self._finish_reason == "length" else "completed"
        events += self.writer.close_all(status)
        events.append(self.writer.end(self._finish_reason, self._usage))
        self._final = events[-1][1]["response"]
        return events

    def failed(self, message: str) -> list[Event]:
        """The events that end a stream the upstream failed: ``response.failed``
        (opening events first, should none have gone out)."""
        events: list[Event] = []
        if not self._started:
            self._started = True
            events += self.writer.start()
        events.append(self.writer.failed(message))
        self._final = events[-1][1]["response"]
        return events

    def result(self) -> dict[str, Any]:
        """The response: final once the stream ended or failed, else as far as it got."""
        return self._final if self._final is not None else self.writer.snapshot()


def response_events(response: dict[str, Any]) -> list[Event]:
    """A finished response object as the events of its stream (the same items, ids and
    final response)."""
    shell = {key: value for key, value in response.items() if key != "output"}
    writer = ResponsesEventWriter(shell)
    events = writer.start()
    for item in response.get("output") or ():
        if item.get("type") == "function_call":
            index, opened = writer.open_call(
                item.get("call_id", ""), item.get("name", ""), item.get("id")
            )
            events += opened + writer.arguments(index, item.get("arguments", ""))
        else:
            text = "".join(
                str(part.get("text", ""))
                for part in item.get("content") or ()
                if part.get("type") == "output_text"
            )
            events += writer.text(text, item.get("id"))
        events += writer.close_all(item.get("status") or "completed")
    kind = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    events.append(writer.event(kind, response=response))
    return events
