"""Anthropic Messages ⇄ OpenAI Chat Completions, so a Claude-SDK client can run on an
OpenAI-compatible upstream.

Requests go Anthropic → OpenAI; responses and streams come back OpenAI → Anthropic.
What has no counterpart is dropped (documents, thinking blocks, ``top_k``, cache
control). Tool-call arguments that are not a JSON object cannot become a tool_use
``input``; they travel as ``{RAW_ARGUMENTS_KEY: "<the raw text>"}`` so nothing the
model produced is lost, and the request translation turns exactly that shape back
into the raw text when a client re-sends it.
"""

from __future__ import annotations

from typing import Any, Final

from reef.core.ids import new_id
from reef.core.jsoncodec import dumps, loads
from reef.upstream.base import UpstreamTruncatedError

RAW_ARGUMENTS_KEY: Final = "_raw_arguments"

_STOP_REASONS: Final = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}

Event = tuple[str, dict[str, Any]]


# -- requests: Anthropic → OpenAI -------------------------------------------------------


def anthropic_request_to_openai(body: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat-completions request equivalent to an Anthropic Messages request.

    ``model`` is the upstream model name to put in the request.
    """
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else _joined_text(system)
        messages.append({"role": "system", "content": text})
    for message in body.get("messages") or ():
        if message.get("role") == "assistant":
            messages.append(_assistant_message(message.get("content")))
        else:
            messages.extend(_user_messages(message.get("content")))
    out: dict[str, Any] = {"model": model, "messages": messages}
    for source, target in (
        ("max_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stop_sequences", "stop"),
    ):
        if body.get(source) is not None:
            out[target] = body[source]
    user_id = (body.get("metadata") or {}).get("user_id")
    if user_id:
        out["user"] = user_id
    tools = [_function_tool(tool) for tool in body.get("tools") or () if "input_schema" in tool]
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if choice:
        _apply_tool_choice(choice, out)
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _user_messages(content: Any) -> list[dict[str, Any]]:
    """A user turn: its tool results first (OpenAI wants them right after the
    assistant's tool calls), then whatever the user wrote."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in content or ():
        kind = block.get("type")
        if kind == "tool_result":
            text = _tool_result_text(block.get("content"))
            if block.get("is_error"):
                text = f"[error] {text}"
            tool_messages.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id", ""), "content": text}
            )
        elif kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            url = _image_url(block.get("source") or {})
            if url:
                parts.append({"type": "image_url", "image_url": {"url": url}})
    if not parts:
        return tool_messages
    if all(part["type"] == "text" for part in parts):
        user: dict[str, Any] = {"role": "user", "content": "\n".join(p["text"] for p in parts)}
    else:
        user = {"role": "user", "content": parts}
    return [*tool_messages, user]


def _assistant_message(content: Any) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in content or ():
        kind = block.get("type")
        if kind == "text":
            texts.append(block.get("text", ""))
        elif kind == "tool_use":
            tool_calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        "arguments": arguments_text(block.get("input")),
                    },
                }
            )
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    elif message["content"] is None:
        message["content"] = ""
    return message


def arguments_text(tool_input: Any) -> str:
    """A tool_use ``input`` as OpenAI ``arguments`` text: the raw text itself when the
    input is the ``RAW_ARGUMENTS_KEY`` shape made of arguments that were no JSON object."""
    if (
        isinstance(tool_input, dict)
        and len(tool_input) == 1
        and isinstance(tool_input.get(RAW_ARGUMENTS_KEY), str)
    ):
        return str(tool_input[RAW_ARGUMENTS_KEY])
    return dumps(tool_input if tool_input is not None else {}).decode()


def _tool_result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    pieces: list[str] = []
    for block in content or ():
        if block.get("type") == "text":
            pieces.append(block.get("text", ""))
        else:
            pieces.append(f"[{block.get('type', 'content')}]")
    return "\n".join(pieces)


def _image_url(source: dict[str, Any]) -> str | None:
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    if source.get("type") == "url":
        return str(source.get("url", "")) or None
    return None


def _joined_text(blocks: Any) -> str:
    return "\n".join(b.get("text", "") for b in blocks or () if b.get("type") == "text")


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _apply_tool_choice(choice: dict[str, Any], out: dict[str, Any]) -> None:
    kind = choice.get("type")
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name", "")}}
    elif kind == "none":
        out["tool_choice"] = "none"
    if choice.get("disable_parallel_tool_use") and "tools" in out:
        out["parallel_tool_calls"] = False


# -- responses: OpenAI → Anthropic ------------------------------------------------------


def openai_response_to_anthropic(resp: dict[str, Any], model: str) -> dict[str, Any]:
    """A Messages API ``message`` equivalent to a chat.completion (its first choice).

    ``model`` is the name the client asked for, reported back as the message's model.
    A choice without a ``finish_reason`` gets a ``stop_reason`` of ``None``: the reason
    is the upstream's to give, never invented.
    """
    choices = resp.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    text = _message_text(message.get("content"))
    content: list[dict[str, Any]] = []
    tool_calls = message.get("tool_calls") or []
    if text or not tool_calls:
        content.append({"type": "text", "text": text})
    for call in tool_calls:
        function = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{new_id().replace('-', '')}",
                "name": function.get("name", ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    usage = resp.get("usage") or {}
    return {
        "id": anthropic_message_id(resp.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason")),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens") or 0,
            "output_tokens": usage.get("completion_tokens") or 0,
        },
    }


def anthropic_message_id(openai_id: Any) -> str:
    """``msg_…`` derived from a ``chatcmpl-…`` id (a fresh one when there is none)."""
    if isinstance(openai_id, str) and openai_id:
        return "msg_" + openai_id.removeprefix("chatcmpl-")
    return "msg_" + new_id().replace("-", "")


def stop_reason(finish_reason: Any) -> str | None:
    """The Anthropic ``stop_reason`` for an OpenAI ``finish_reason``."""
    if finish_reason is None:
        return None
    return _STOP_REASONS.get(str(finish_reason), "end_turn")


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool_use ``input`` from OpenAI ``arguments`` text: the parsed object; ``{}``
    for empty text; ``{RAW_ARGUMENTS_KEY: text}`` when it is not a JSON object."""
    if isinstance(arguments, dict):
        return arguments
    if not arguments or not str(arguments).strip():
        return {}
    try:
        parsed = loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    return {RAW_ARGUMENTS_KEY: str(arguments)}


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


# -- streams: OpenAI chunks → Anthropic events ------------------------------------------


class OpenAIToAnthropicStream:
    """Turns chat.completion.chunk objects into Anthropic stream events, one chunk at a
    time (first choice only).

    Blocks are opened in the order content arrives: text, then each tool call as its
    first delta appears; a block is stopped when the next one starts. Should a server
    interleave argument deltas of parallel tool calls, a late delta is still emitted
    under its own block's index (clients assemble by index).
    """

    def __init__(self, model: str) -> None:
        self._model = model
        self._started = False
        self._finished = False
        self._next_index = 0
        self._open: int | None = None  # block index of the open block
        self._text_index: int | None = None
        self._tool_index: dict[int, int] = {}  # OpenAI tool-call index → block index
        self._stop_reason: str | None = None
        self._input_tokens = 0
        self._output_tokens = 0

    def feed(self, chunk: dict[str, Any]) -> list[Event]:
        """Events for one chunk (the first call also yields ``message_start``)."""
        events: list[Event] = []
        if not self._started:
            self._start(chunk, events)
        usage = chunk.get("usage")
        if usage:
            self._input_tokens = usage.get("prompt_tokens") or 0
            self._output_tokens = usage.get("completion_tokens") or 0
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if text:
                self._text(text, events)
            for call in delta.get("tool_calls") or ():
                self._tool_call(call, events)
            if choice.get("finish_reason"):
                self._stop_reason = stop_reason(choice["finish_reason"])
        return events

    @property
    def stop_reason(self) -> str | None:
        """The stop reason of the first choice's ``finish_reason``; ``None`` until one
        arrives."""
        return self._stop_reason

    def finish(self) -> list[Event]:
        """The closing events: stop of the open block, ``message_delta`` (stop reason,
        usage) and ``message_stop``. Idempotent: a second call returns nothing.

        Raises ``UpstreamTruncatedError`` when no ``finish_reason`` arrived: the stream
        was cut short, and a stop reason made up here would tell the client otherwise.
        """
        if self._finished:
            return []
        if self._stop_reason is None:
            raise UpstreamTruncatedError("the stream ended before a finish_reason")
        self._finished = True
        events: list[Event] = []
        if not self._started:
            self._start({}, events)
        self._close_open(events)
        usage = {"input_tokens": self._input_tokens, "output_tokens": self._output_tokens}
        events.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self._stop_reason, "stop_sequence": None},
                    "usage": usage,
                },
            )
        )
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _start(self, chunk: dict[str, Any], events: list[Event]) -> None:
        self._started = True
        message: dict[str, Any] = {
            "id": anthropic_message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        events.append(("message_start", {"type": "message_start", "message": message}))

    def _text(self, text: str, events: list[Event]) -> None:
        if self._open is None or self._open != self._text_index:
            self._close_open(events)
            self._text_index = self._open_block({"type": "text", "text": ""}, events)
        events.append(_delta(self._text_index, {"type": "text_delta", "text": text}))

    def _tool_call(self, call: dict[str, Any], events: list[Event]) -> None:
        position = call.get("index", 0)
        function = call.get("function") or {}
        block = self._tool_index.get(position)
        if block is None:
            self._close_open(events)
            block = self._open_block(
                {
                    "type": "tool_use",
                    "id": call.get("id") or f"toolu_{new_id().replace('-', '')}",
                    "name": function.get("name", ""),
                    "input": {},
                },
                events,
            )
            self._tool_index[position] = block
            # Text after a tool call opens a new text block, never reopens the old one.
            self._text_index = None
        arguments = function.get("arguments")
        if arguments:
            events.append(_delta(block, {"type": "input_json_delta", "partial_json": arguments}))

    def _open_block(self, block: dict[str, Any], events: list[Event]) -> int:
        index = self._next_index
        self._next_index += 1
        self._open = index
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": block},
            )
        )
        return index

    def _close_open(self, events: list[Event]) -> None:
        if self._open is not None:
            events.append(
                ("content_block_stop", {"type": "content_block_stop", "index": self._open})
            )
            self._open = None


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
