"""OpenAI Responses ⇄ Chat Completions, so a Responses client can run on a
chat-completions upstream (vLLM, SGLang, the embedded engine).

Requests go Responses → chat: ``instructions`` becomes the system message, the
``input`` items become messages (a ``function_call`` joins the assistant message before
it as a tool call; a ``function_call_output`` becomes a ``tool`` message), and the
sampling, tool and format fields their chat counterparts. Responses come back chat →
Responses: the first choice's text becomes a ``message`` item, each tool call a
``function_call`` item. Streams are in ``reef.upstream.responses.stream``.

The translation assumes a body the gateway has checked (``reef.gateway.body_checks``):
what has no counterpart (reasoning items, built-in tools, …) is refused there with a
400 naming it, never dropped here. The conversation a Responses request continues
(``previous_response_id``) is resolved by the gateway before translation: ``input``
then holds the whole conversation.
"""

from __future__ import annotations

from typing import Any, Final

from reef.core.ids import new_id

# Request fields with the same name and meaning in both APIs.
_SAME_FIELDS: Final = ("temperature", "top_p", "parallel_tool_calls", "user")
_INCOMPLETE: Final = {"length": "max_output_tokens", "content_filter": "content_filter"}
_SHELL_DEFAULTS: Final[dict[str, Any]] = {
    "instructions": None,
    "max_output_tokens": None,
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "temperature": 1.0,
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}


def item_id(prefix: str) -> str:
    """A fresh id for a Responses object: ``resp``, ``msg``, ``fc``, ``fco`` …"""
    return f"{prefix}_{new_id().replace('-', '')}"


def response_id_for(record_id: str) -> str:
    """The response id of the exchange whose record is ``record_id`` (one to one)."""
    return "resp_" + record_id.replace("-", "")


# -- requests: Responses → chat ----------------------------------------------------------


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's ``input`` as a list of items (a string is one user message; an
    item without a ``type`` is a message, as the API reads it)."""
    raw = body.get("input")
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    items: list[dict[str, Any]] = []
    for item in raw:
        items.append(item if "type" in item else {"type": "message", **item})
    return items


def items_to_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages for Responses items (``message``, ``function_call``,
    ``function_call_output``)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item))
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": _output_text(item.get("output")),
                }
            )
    return messages


def _message(item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role", "user")
    if role == "developer":
        role = "system"  # not every chat server knows "developer"
    content = item.get("content")
    if isinstance(content, str) or content is None:
        return {"role": role, "content": content or ""}
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image":
            image: dict[str, Any] = {"url": part.get("image_url", "")}
            if part.get("detail"):
                image["detail"] = part["detail"]
            parts.append({"type": "image_url", "image_url": image})
    if all(part["type"] == "text" for part in parts):
        return {"role": role, "content": "\n".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    return "\n".join(
        str(part.get("text", "")) for part in output or () if part.get("type") == "input_text"
    )


def responses_request_to_openai(body: dict[str, Any], model: str) -> dict[str, Any]:  # noqa: C901
    """A chat-completions request equivalent to a (checked) Responses request whose
    ``input`` holds the whole conversation; ``model`` is the upstream model name."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    messages.extend(items_to_messages(input_items(body)))
    out: dict[str, Any] = {"model": model, "messages": messages}
    for name in _SAME_FIELDS:
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    tools = [_function_tool(tool) for tool in body.get("tools") or ()]
    if tools:
        out["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        out["tool_choice"] = choice
    elif isinstance(choice, dict):
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name", "")}}
    response_format = _response_format((body.get("text") or {}).get("format"))
    if response_format is not None:
        out["response_format"] = response_format
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        out["reasoning_effort"] = effort
    if body.get("stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.get("name", "")}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
    return {"type": "json_schema", "json_schema": schema}


# -- responses: chat → Responses ---------------------------------------------------------


def response_shell(
    body: dict[str, Any], response_id: str, model: str, created_at: int
) -> dict[str, Any]:
    """The response object for ``body`` before any output: the request's settings
    echoed as the API reports them, ``status`` ``in_progress``."""
    shell: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        "metadata": body.get("metadata") or {},
        "store": body.get("store") is not False,
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
    }
    for key, default in _SHELL_DEFAULTS.items():
        value = body.get(key)
        shell[key] = default if value is None else value
    shell["tools"] = [_echoed_tool(tool) for tool in shell["tools"]]
    return shell


def _echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"description": None, "parameters": None, "strict": None, **tool}


def message_item(text: str, status: str = "completed", msg_id: str | None = None) -> dict[str, Any]:
    """An assistant ``message`` output item holding ``text``."""
    return {
        "id": msg_id or item_id("msg"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text_part(text)],
    }


def output_text_part(text: str) -> dict[str, Any]:
    """An ``output_text`` content part."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    call_id: str, name: str, arguments: str, status: str = "completed", fc_id: str | None = None
) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {
        "id": fc_id or item_id("fc"),
        "type": "function_call",
        "status": status,
        "call_id": call_id or item_id("call"),
        "name": name,
        "arguments": arguments,
    }


def finished(
    shell: dict[str, Any],
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """``shell`` completed with ``output``: ``incomplete`` (with the reason) when the
    upstream stopped at the token limit or a content filter, else ``completed``."""
    reason = _INCOMPLETE.get(str(finish_reason))
    response = {**shell, "output": output, "usage": responses_usage(usage)}
    if reason is not None:
        response["status"] = "incomplete"
        response["incomplete_details"] = {"reason": reason}
    else:
        response["status"] = "completed"
    return response


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Chat ``usage`` as Responses usage (``None`` when the upstream sent none)."""
    if not usage:
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }


def openai_response_to_responses(
    completion: dict[str, Any], shell: dict[str, Any]
) -> dict[str, Any]:
    """The response object for a chat.completion (its first choice), on ``shell``."""
    choice = (completion.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    finish_reason = choice.get("finish_reason")
    status = "incomplete" if finish_reason in _INCOMPLETE else "completed"
    output: list[dict[str, Any]] = []
    text = _chat_text(message.get("content"))
    if text:
        output.append(message_item(text, status))
    if message.get("refusal"):
        refusal = {"type": "refusal", "refusal": message["refusal"]}
        if output:
            output[0]["content"].append(refusal)
        else:
            output.append({**message_item("", status), "content": [refusal]})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        output.append(
            function_call_item(
                call.get("id") or "", function.get("name", ""), function.get("arguments") or ""
            )
        )
    if not output:
        output.append(message_item("", status))
    return finished(shell, output, finish_reason, completion.get("usage"))


def _chat_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
    return ""
