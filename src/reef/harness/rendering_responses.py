"""Applying a harness to an OpenAI Responses request (pure; run per request), for an
upstream that gets the Responses API itself (``responses: native``).

Same rules as :mod:`reef.harness.rendering`, in the Responses shape:

- the system text goes into ``instructions`` before the client's own;
- examples (stored OpenAI chat-style) become input items before the conversation: a
  message item per user or assistant message, an assistant's ``tool_calls`` one
  ``function_call`` item each, a ``tool`` message a ``function_call_output``;
- ``input`` given as a string becomes one user message item after them;
- harness tools become Responses function tools (``{"type": "function", "name", …}``);
- params: ``max_tokens`` becomes ``max_output_tokens``; ``temperature``, ``top_p``,
  ``parallel_tool_calls``, ``metadata`` keep their names; parameters the Responses API
  does not have (``stop``, ``seed``, ``presence_penalty``, ``n``, …) are left out;
- ``tool_choice``: strings stay, an OpenAI function choice becomes
  ``{"type": "function", "name": …}``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from reef.harness.model import Harness
from reef.harness.rendering import (
    MAX_SKILLS,
    annotate_tools,
    apply_params,
    content_text,
    merge_text,
    merge_tools,
    system_text,
)

_KEPT_PARAMS = frozenset({"temperature", "top_p", "parallel_tool_calls", "metadata"})
_RENAMED_PARAMS = {"max_tokens": "max_output_tokens"}
_ALIASES: Mapping[str, tuple[str, ...]] = {}
_TEXT_PARTS = ("input_text", "output_text", "text")


def responses_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI chat function tool as a Responses function tool."""
    function = tool["function"]
    out: dict[str, Any] = {"type": "function", "name": function["name"]}
    for key in ("description", "parameters", "strict"):
        if function.get(key) is not None:
            out[key] = copy.deepcopy(function[key])
    return out


def responses_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Harness params (chat names) as Responses request params (module docstring)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key in _RENAMED_PARAMS:
            out[_RENAMED_PARAMS[key]] = value
        elif key in _KEPT_PARAMS:
            out[key] = value
    return out


def responses_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """A chat ``tool_choice`` as a Responses one (module docstring)."""
    function = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(function, dict) and "name" in function:
        return {"type": "function", "name": function["name"]}
    return copy.deepcopy(choice)


def example_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One chat-style example message as Responses input items."""
    role, content = message["role"], message.get("content")
    if role == "tool":
        output = {"call_id": message["tool_call_id"], "output": content_text(content)}
        return [{"type": "function_call_output", **output}]
    items: list[dict[str, Any]] = []
    text = content_text(content) if isinstance(content, list) else content
    if text or not message.get("tool_calls"):
        items.append({"type": "message", "role": role, "content": text or ""})
    for call in message.get("tool_calls") or () if role == "assistant" else ():
        function = call.get("function") or {}
        arguments = function.get("arguments")
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id", ""),
                "name": function.get("name", ""),
                "arguments": arguments if isinstance(arguments, str) else "{}",
            }
        )
    return items


def _items(raw: Any) -> list[Any]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"type": "message", "role": "user", "content": raw}]
    return list(raw) if isinstance(raw, list) else [raw]


def last_user_input_text(items: list[Any]) -> str:
    """The text of the last user message item (empty when there is none)."""
    for item in reversed(items):
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        if item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            return content
        return "\n".join(
            str(part.get("text", ""))
            for part in content or ()
            if isinstance(part, dict) and part.get("type") in _TEXT_PARTS
        )
    return ""


def _tool_name(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def render_responses(
    harness: Harness, body: Mapping[str, Any], *, max_skills: int = MAX_SKILLS
) -> dict[str, Any]:
    """A new Responses body: ``body`` with ``harness`` applied (module rules)."""
    out = dict(body)
    conversation = _items(body.get("input"))
    reef_text = system_text(harness, last_user_input_text(conversation), max_skills)
    if reef_text:
        out["instructions"] = merge_text(reef_text, body.get("instructions"))
    examples = [item for ex in harness.examples for m in ex.messages for item in example_items(m)]
    if examples:
        out["input"] = examples + conversation
    harness_tools = [responses_tool(tool) for tool in harness.tools]
    tools = merge_tools(body.get("tools"), harness_tools, _tool_name)
    tools = annotate_tools(tools, harness.tool_notes, _tool_name, lambda t: (t, "parameters"))
    if tools is not None:
        out["tools"] = tools
    enforced = [_RENAMED_PARAMS.get(key, key) for key in harness.enforced_params]
    apply_params(out, body, responses_params(harness.params), enforced, _ALIASES)
    choice = harness.orchestration.tool_choice
    if choice is not None and out.get("tools") and body.get("tool_choice") is None:
        out["tool_choice"] = responses_tool_choice(choice)
    return out
