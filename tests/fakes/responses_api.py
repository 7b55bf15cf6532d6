"""The fake upstream's own OpenAI Responses API (``POST /v1/responses``), written apart
from Reef's translation so that a passthrough test checks Reef against an independent
server.

Replies as the chat fake does: ``echo: <last user text>``; with function tools offered
and "weather" in the text, a call of the first tool with ``{"city": "Paris"}``; after a
``function_call_output``, ``tool said: <output>``. ``error-mid-stream`` in the text ends
a stream with the upstream's own ``response.failed`` after a few events. Nothing is
stored upstream: ``previous_response_id`` is refused, as Reef must resolve it.
"""

from __future__ import annotations

from typing import Any

import orjson

CREATED = 1_700_000_000


def last_input(body: dict[str, Any]) -> dict[str, Any]:
    """The last input item (a string input is one user message)."""
    value = body.get("input")
    if isinstance(value, str):
        return {"type": "message", "role": "user", "content": value}
    items = [item for item in value or () if isinstance(item, dict)]
    return items[-1] if items else {}


def item_text(item: dict[str, Any]) -> str:
    """A message item's text, or a function_call_output's output."""
    if item.get("type") == "function_call_output":
        return str(item.get("output", ""))
    content = item.get("content")
    if isinstance(content, str):
        return content
    return " ".join(p.get("text", "") for p in content or () if isinstance(p, dict))


def responses_answer(body: dict[str, Any], serial: int, model: str) -> dict[str, Any]:
    """The completed ``response`` object answering ``body``."""
    last = last_input(body)
    text = item_text(last)
    tools = [t for t in body.get("tools") or () if t.get("type") == "function"]
    output: list[dict[str, Any]]
    if last.get("type") == "function_call_output":
        output = [_message(f"msg_fake{serial}", f"tool said: {text}")]
    elif tools and "weather" in text.lower():
        call = {
            "id": f"fc_fake{serial}",
            "type": "function_call",
            "status": "completed",
            "call_id": f"call_fake{serial}",
            "name": tools[0]["name"],
            "arguments": '{"city": "Paris"}',
        }
        output = [call]
    else:
        output = [_message(f"msg_fake{serial}", f"echo: {text}")]
    words = len(text.split())
    produced = sum(len(item_text(o).split()) if o["type"] == "message" else 2 for o in output)
    return {
        "id": f"resp_fake{serial}",
        "object": "response",
        "created_at": CREATED,
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "model": body.get("model") or model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": words,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": produced,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": words + produced,
        },
    }


def _message(msg_id: str, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": msg_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def responses_events(response: dict[str, Any], fail_mid_stream: bool = False) -> list[bytes]:
    """``response`` as the typed events of its stream (a message's text word by word, a
    call's arguments in two pieces); with ``fail_mid_stream`` the upstream's own
    ``response.failed`` after the first delta."""
    events: list[bytes] = []

    def event(kind: str, **fields: Any) -> None:
        payload = {"type": kind, "sequence_number": len(events), **fields}
        events.append(b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")

    opening = {**response, "status": "in_progress", "output": [], "usage": None}
    event("response.created", response=opening)
    event("response.in_progress", response=opening)
    for index, item in enumerate(response["output"]):
        where = {"output_index": index, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            event("response.output_item.added", output_index=index, item={**item, "content": []})
            empty = {"type": "output_text", "text": "", "annotations": []}
            event("response.content_part.added", **where, content_index=0, part=empty)
            for position, word in enumerate(text.split(" ")):
                piece = word if position == 0 else " " + word
                event("response.output_text.delta", **where, content_index=0, delta=piece)
                if fail_mid_stream:
                    failed = {
                        **opening,
                        "status": "failed",
                        "error": {"code": "server_error", "message": "fake upstream overloaded"},
                    }
                    event("response.failed", response=failed)
                    return events
            event("response.output_text.done", **where, content_index=0, text=text)
            event("response.content_part.done", **where, content_index=0, part=item["content"][0])
        else:
            started = {**item, "status": "in_progress", "arguments": ""}
            event("response.output_item.added", output_index=index, item=started)
            arguments = item["arguments"]
            for piece in (arguments[: len(arguments) // 2], arguments[len(arguments) // 2 :]):
                event("response.function_call_arguments.delta", **where, delta=piece)
            event("response.function_call_arguments.done", **where, arguments=arguments)
        event("response.output_item.done", output_index=index, item=item)
    event("response.completed", response=response)
    return events
