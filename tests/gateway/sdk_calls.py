"""One chat turn through an official SDK, streamed or not, reduced to what a client saw."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
import openai

Dialect = Literal["openai", "anthropic"]


@dataclass(frozen=True)
class Reply:
    """What the client got: status, receipt, the answer's text, stop reason, tool calls."""

    status: int
    receipt: str | None
    text: str
    stop: str | None
    tools: tuple[tuple[str, str], ...] = ()  # (name, arguments as JSON text, no spaces)
    usage: int | None = None  # completion / output tokens, when the client got usage
    session: str | None = None
    release: str | None = None


def turn(
    client: openai.OpenAI | anthropic.Anthropic,
    text: str,
    *,
    stream: bool,
    headers: dict[str, str],
    model: str = "gpt-4o",
    tools: list[dict[str, Any]] | None = None,
    include_usage: bool = False,
) -> Reply:
    """Send one user turn; API errors become a ``Reply`` with their status."""
    if isinstance(client, openai.OpenAI):
        try:
            return _chat(client, text, stream, headers, model, tools, include_usage)
        except openai.APIStatusError as exc:
            return Reply(exc.status_code, exc.response.headers.get("x-reef-record-id"), "", None)
    try:
        return _message(client, text, stream, headers, model, tools)
    except anthropic.APIStatusError as exc:
        return Reply(exc.status_code, exc.response.headers.get("x-reef-record-id"), "", None)


def _receipt(headers: Any) -> dict[str, Any]:
    return {
        "receipt": headers.get("x-reef-record-id"),
        "session": headers.get("x-reef-session-id"),
        "release": headers.get("x-reef-release-id"),
    }


def _chat(
    client: openai.OpenAI,
    text: str,
    stream: bool,
    headers: dict[str, str],
    model: str,
    tools: list[dict[str, Any]] | None,
    include_usage: bool,
) -> Reply:
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "extra_headers": headers,
    }
    if tools:
        kwargs["tools"] = tools
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        completion = raw.parse()
        message = completion.choices[0].message
        calls = tuple(
            (c.function.name, c.function.arguments.replace(" ", ""))
            for c in message.tool_calls or ()
            if c.type == "function"
        )
        usage = completion.usage.completion_tokens if completion.usage else None
        return Reply(
            raw.http_response.status_code,
            text=message.content or "",
            stop=completion.choices[0].finish_reason,
            tools=calls,
            usage=usage,
            **_receipt(raw.headers),
        )
    if include_usage:
        kwargs["stream_options"] = {"include_usage": True}
    with client.chat.completions.with_streaming_response.create(stream=True, **kwargs) as response:
        chunks = list(response.parse())
        status, receipt = response.status_code, _receipt(response.headers)
    pieces, stop, arguments, names = [], None, {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            stop = choice.finish_reason or stop
            for call in choice.delta.tool_calls or ():
                if call.function and call.function.name:
                    names[call.index] = call.function.name
                if call.function and call.function.arguments:
                    arguments[call.index] = arguments.get(call.index, "") + call.function.arguments
    calls = tuple((names[i], arguments.get(i, "").replace(" ", "")) for i in sorted(names))
    usage = next((c.usage.completion_tokens for c in chunks if c.usage), None)
    return Reply(status, text="".join(pieces), stop=stop, tools=calls, usage=usage, **receipt)


def _message(
    client: anthropic.Anthropic,
    text: str,
    stream: bool,
    headers: dict[str, str],
    model: str,
    tools: list[dict[str, Any]] | None,
) -> Reply:
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        "extra_headers": headers,
    }
    if tools:
        kwargs["tools"] = tools
    if stream:
        with client.messages.stream(**kwargs) as events:
            final = events.get_final_message()
            status, receipt = events.response.status_code, _receipt(events.response.headers)
    else:
        raw = client.messages.with_raw_response.create(**kwargs)
        final = raw.parse()
        status, receipt = raw.http_response.status_code, _receipt(raw.headers)
    said = "".join(block.text for block in final.content if block.type == "text")
    calls = tuple(
        (block.name, compact_json(block.input))
        for block in final.content
        if block.type == "tool_use"
    )
    return Reply(
        status,
        text=said,
        stop=final.stop_reason,
        tools=calls,
        usage=final.usage.output_tokens,
        **receipt,
    )


def compact_json(value: Any) -> str:
    """``value`` as JSON text without spaces (how tool arguments are compared)."""
    return json.dumps(value, separators=(",", ":"))
