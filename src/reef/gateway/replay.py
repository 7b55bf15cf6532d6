"""Answering a request from its stored record (an idempotency key seen before).

The record holds the response in the client's dialect as the client got it (after
``capture.redact_patterns``: what was redacted is not given back). A request that did
not stream gets it as JSON; a streaming one gets the same answer as an event stream of
its dialect — one delta per content block, then the stop reason and usage — which
every SDK reassembles into the same message. A chat record may also hold token
logprobs the client did not ask for (a teacher's, kept for logit distillation,
docs/distillation.md): the answer has them null, as the client first got it.
"""

from __future__ import annotations

from typing import Any

from reef.core import dumps
from reef.experience import RecordView
from reef.gateway.distill import asked_logprobs, without_logprobs
from reef.gateway.idempotency import Answer
from reef.gateway.responses.receipt import stream_receipt
from reef.upstream import encode_sse, response_events


def stored_answer(view: RecordView, headers: dict[str, str]) -> Answer:
    """The answer ``view`` (an ``ok`` record with its response) gives its request,
    with ``headers`` (its receipt)."""
    response = view.response or {}
    request = view.request
    if view.api == "openai.chat" and not asked_logprobs(request):
        response = without_logprobs(response, as_null=True)
    if not request.get("stream"):
        return Answer(200, "application/json", headers, dumps(response))
    if view.api == "anthropic.messages":
        body = anthropic_events(response)
    elif view.api == "openai.responses":
        *events, (name, terminal) = response_events(response)
        events.append((name, {**terminal, "x_reef": stream_receipt(headers)}))
        body = b"".join(_event(name, payload) for name, payload in events)
    elif view.api == "openai.completions":
        options = request.get("stream_options")
        body = completion_chunks(
            response, isinstance(options, dict) and bool(options.get("include_usage"))
        )
    else:
        options = request.get("stream_options")
        usage = isinstance(options, dict) and bool(options.get("include_usage"))
        body = openai_chunks(response, usage)
    return Answer(200, "text/event-stream", {**headers, "cache-control": "no-cache"}, body)


def openai_chunks(completion: dict[str, Any], include_usage: bool) -> bytes:
    """A ``chat.completion`` as the ``chat.completion.chunk`` events of its stream."""
    base: dict[str, Any] = {
        "id": completion.get("id", ""),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    if "system_fingerprint" in completion:
        base["system_fingerprint"] = completion["system_fingerprint"]
    if include_usage:
        base["usage"] = None
    out: list[bytes] = []

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> None:
        out.append(encode_sse(dumps({**base, "choices": choices, **extra})))

    for choice in completion.get("choices") or ():
        index = choice.get("index", 0)
        message = choice.get("message") or {}
        delta: dict[str, Any] = {
            "role": message.get("role") or "assistant",
            "content": message.get("content") or "",
        }
        for name in ("reasoning_content", "refusal"):
            if message.get(name):
                delta[name] = message[name]
        if message.get("tool_calls"):
            delta["tool_calls"] = [
                {"index": position, **call} for position, call in enumerate(message["tool_calls"])
            ]
        chunk([{"index": index, "delta": delta, "finish_reason": None, "logprobs": None}])
        finish = choice.get("finish_reason")
        chunk([{"index": index, "delta": {}, "finish_reason": finish, "logprobs": None}])
    if include_usage and completion.get("usage"):
        chunk([], usage=completion["usage"])
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def completion_chunks(completion: dict[str, Any], include_usage: bool) -> bytes:
    """A ``text_completion`` as the chunks of its stream: each choice's text, then its
    finish reason."""
    base = {
        "id": completion.get("id", ""),
        "object": "text_completion",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    out: list[bytes] = []
    for choice in completion.get("choices") or ():
        index = choice.get("index", 0)
        for text, finish in ((choice.get("text") or "", None), ("", choice.get("finish_reason"))):
            piece = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            out.append(encode_sse(dumps({**base, "choices": [piece]})))
    if include_usage and completion.get("usage"):
        out.append(encode_sse(dumps({**base, "choices": [], "usage": completion["usage"]})))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def anthropic_events(message: dict[str, Any]) -> bytes:
    """A Messages API ``message`` as the events of its stream."""
    usage = dict(message.get("usage") or {})
    output_tokens = usage.pop("output_tokens", 0)
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    out = [_event("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message.get("content") or ()):
        opening, deltas = _block_parts(block)
        out.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opening},
            )
        )
        for delta in deltas:
            out.append(
                _event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    out.append(
        _event(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": message.get("stop_reason"),
                    "stop_sequence": message.get("stop_sequence"),
                },
                "usage": {"output_tokens": output_tokens},
            },
        )
    )
    out.append(_event("message_stop", {"type": "message_stop"}))
    return b"".join(out)


def _block_parts(block: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A content block's ``content_block_start`` payload and its deltas."""
    kind = block.get("type")
    if kind == "text":
        return {**block, "text": ""}, [{"type": "text_delta", "text": block.get("text", "")}]
    if kind in ("tool_use", "server_tool_use"):
        arguments = dumps(block.get("input") or {}).decode()
        return {**block, "input": {}}, [{"type": "input_json_delta", "partial_json": arguments}]
    if kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block.get("thinking", "")}]
        if block.get("signature"):
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        return {"type": "thinking", "thinking": "", "signature": ""}, deltas
    return block, []  # e.g. redacted_thinking: whole in its start event


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return encode_sse(dumps(payload), name)
