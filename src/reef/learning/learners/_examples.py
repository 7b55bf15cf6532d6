"""What the learners read out of a ``TrainingExample`` as plain text: the conversation,
the served reply and the correction (shared by sft, preference and rl), and the same with
personal data scrubbed (for the harness learners, whose output every key can download)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from reef.core.chat_format import assistant_text
from reef.experience import scrub_personal_text, scrub_personal_value
from reef.learning.base import TrainingExample


def content_text(content: Any) -> str:
    """Message content as plain text (OpenAI content parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    return "" if content is None else str(content)


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with their roles and content as text, as the trainers take them."""
    return [
        {"role": str(m.get("role", "user")), "content": content_text(m.get("content"))}
        for m in messages
    ]


def served_text(item: TrainingExample) -> str | None:
    """The text of the reply that was served, if any."""
    content = None if item.response is None else item.response.get("content")
    text = content_text(content) if content is not None else ""
    return text or None


def correction_text(item: TrainingExample) -> str | None:
    """The correction as text, if any."""
    if item.correction is None:
        return None
    return item.target_text()


def uses_tools(item: TrainingExample) -> bool:
    """Whether the example's request offered tools or its conversation holds tool calls
    or results: then it trains with them (``tool_messages``)."""
    return bool(item.tools) or any(
        m.get("tool_calls") or m.get("role") == "tool" for m in item.messages
    )


def tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical ``messages`` as a chat template takes them with tools: content as text,
    assistant ``tool_calls`` in OpenAI's shape, ``tool`` results with their
    ``tool_call_id`` (what ``reef.core.chat_format.render_tools`` renders)."""
    out = []
    for message in messages:
        converted: dict[str, Any] = {
            "role": str(message.get("role", "user")),
            "content": content_text(message.get("content")),
        }
        if message.get("tool_calls"):
            converted["tool_calls"] = [openai_call(call) for call in message["tool_calls"]]
        if message.get("tool_call_id"):
            converted["tool_call_id"] = message["tool_call_id"]
        out.append(converted)
    return out


def openai_call(call: dict[str, Any]) -> dict[str, Any]:
    """A canonical tool call (``{"name", "arguments"}``) in OpenAI's shape."""
    if isinstance(call.get("function"), dict):
        return call
    return {
        "id": call.get("id") or "",
        "type": "function",
        "function": {"name": call.get("name", ""), "arguments": call.get("arguments") or "{}"},
    }


def reply_text(message: dict[str, Any]) -> str | None:
    """A canonical assistant message as the engine's text of it: its content, then
    each of its tool calls as a ``<tool_call>`` block (``assistant_text``); None when
    it says nothing."""
    converted = tool_messages([{**message, "role": "assistant"}])[0]
    return assistant_text(converted) or None


def tool_served_text(item: TrainingExample) -> str | None:
    """The served reply of a tool-using turn as the engine's text (calls included)."""
    return None if item.response is None else reply_text(item.response)


def tool_correction_text(item: TrainingExample) -> str | None:
    """The correction of a tool-using turn as the engine's text: an assistant message
    (tool calls included) as :func:`reply_text`, anything else as ``target_text``."""
    if item.correction is None:
        return None
    if isinstance(item.correction, dict):
        return reply_text(item.correction)
    return item.target_text()


def transcript_line(message: dict[str, Any]) -> str:
    """One canonical message as a reflector reads it: ``role: text``, then each tool
    call as ``call name(arguments)``; a tool result names the call it answers."""
    role = str(message.get("role", "?"))
    if role == "tool" and message.get("tool_call_id"):
        role = f"tool ({message['tool_call_id']})"
    text = content_text(message.get("content"))
    calls = "; ".join(
        f"call {call.get('name') or (call.get('function') or {}).get('name')}"
        f"({call.get('arguments') or (call.get('function') or {}).get('arguments') or ''})"
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    )
    return f"{role}: {' '.join(part for part in (text, calls) if part)}"


def scrubbed_message(message: dict[str, Any], counts: Counter[str]) -> dict[str, Any]:
    """``message`` with personal data in its content and tool-call arguments replaced by
    typed placeholders (``reef.experience.scrub_personal_value``); roles, names and ids
    stay. ``counts`` gains one per replacement, by kind."""
    out = dict(message)
    if "content" in out:
        out["content"] = scrub_personal_value(out["content"], counts)
    if out.get("tool_calls"):
        out["tool_calls"] = [_scrubbed_call(call, counts) for call in out["tool_calls"]]
    return out


def _scrubbed_call(call: Any, counts: Counter[str]) -> Any:
    if not isinstance(call, dict):
        return call
    out = dict(call)
    if isinstance(out.get("arguments"), str):
        out["arguments"] = scrub_personal_text(out["arguments"], counts)
    function = out.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        out["function"] = {
            **function,
            "arguments": scrub_personal_text(function["arguments"], counts),
        }
    return out


def scrubbed_example(item: TrainingExample, counts: Counter[str]) -> TrainingExample:
    """``item`` with personal data scrubbed from everything a harness learner may copy:
    the conversation, the served reply, the correction and the feedback."""
    correction = item.correction
    if isinstance(correction, dict):
        correction = scrubbed_message(correction, counts)
    elif correction is not None:
        correction = scrub_personal_value(correction, counts)
    return dataclasses.replace(
        item,
        messages=[scrubbed_message(m, counts) for m in item.messages],
        response=None if item.response is None else scrubbed_message(item.response, counts),
        correction=correction,
        feedback=[scrub_personal_value(f, counts) for f in item.feedback],
        # The lossless copy is for replays, not harnesses: dropped, not carried unscrubbed.
        chat_messages=None,
    )
