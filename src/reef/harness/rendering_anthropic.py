"""Applying a harness to an Anthropic Messages request (pure; run per request).

Same rules as :mod:`reef.harness.rendering`, in the Anthropic shape:

- the system text goes into ``system`` before the client's (a string stays a string;
  a list of blocks gets a text block first);
- examples (stored OpenAI-style) are converted: assistant ``tool_calls`` become
  ``tool_use`` blocks, ``tool`` messages become user ``tool_result`` blocks;
- harness tools are converted to ``{"name", "description", "input_schema"}``;
- params: ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``metadata`` keep
  their names, ``stop`` becomes ``stop_sequences`` (a string becomes a one-item list);
  parameters Anthropic does not have (``presence_penalty``, ``seed``, ``n``, …) are
  left out;
- ``tool_choice``: ``auto`` → ``{"type": "auto"}``, ``required`` → ``{"type": "any"}``,
  ``none`` → ``{"type": "none"}``, an OpenAI function choice → ``{"type": "tool",
  "name": …}``; any other object is passed as is.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from reef.core.jsoncodec import loads
from reef.harness.model import Harness
from reef.harness.rendering import (
    MAX_SKILLS,
    annotate_tools,
    apply_params,
    content_text,
    last_user_text,
    merge_text,
    merge_tools,
    system_text,
)

_KEPT_PARAMS = frozenset({"max_tokens", "temperature", "top_p", "top_k", "metadata"})
_ALIASES: Mapping[str, tuple[str, ...]] = {}


def anthropic_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI function tool as an Anthropic tool."""
    function = tool["function"]
    return {
        "name": function["name"],
        "description": function.get("description", ""),
        "input_schema": copy.deepcopy(
            function.get("parameters") or {"type": "object", "properties": {}}
        ),
    }


def anthropic_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Harness params (OpenAI names) as Anthropic request params (module docstring)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "stop":
            out["stop_sequences"] = [value] if isinstance(value, str) else list(value)
        elif key in _KEPT_PARAMS or key == "stop_sequences":
            out[key] = value
    return out


def anthropic_tool_choice(choice: str | dict[str, Any]) -> dict[str, Any]:
    """An OpenAI ``tool_choice`` as an Anthropic one (module docstring)."""
    if isinstance(choice, str):
        return {"type": {"auto": "auto", "required": "any", "none": "none"}[choice]}
    function = choice.get("function")
    if choice.get("type") == "function" and isinstance(function, dict) and "name" in function:
        return {"type": "tool", "name": function["name"]}
    return copy.deepcopy(choice)


def _tool_input(arguments: Any) -> Any:
    if isinstance(arguments, dict):
        return copy.deepcopy(arguments)
    try:
        parsed = loads(arguments) if isinstance(arguments, str) and arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"value": parsed}


def anthropic_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """One OpenAI-style example message as an Anthropic message."""
    role, content = message["role"], message.get("content")
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": message["tool_call_id"],
            "content": content_text(content),
        }
        return {"role": "user", "content": [result]}
    calls = message.get("tool_calls") or []
    if role != "assistant" or not calls:
        return {"role": role, "content": copy.deepcopy(content) if content is not None else ""}
    blocks: list[dict[str, Any]] = []
    if content_text(content):
        blocks.append({"type": "text", "text": content_text(content)})
    for call in calls:
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": _tool_input(function.get("arguments")),
            }
        )
    return {"role": "assistant", "content": blocks}


def _tool_name(tool: Any) -> str | None:
    name = tool.get("name") if isinstance(tool, dict) else None
    return name if isinstance(name, str) else None


def render_anthropic(
    harness: Harness, body: Mapping[str, Any], *, max_skills: int = MAX_SKILLS
) -> dict[str, Any]:
    """A new Messages body: ``body`` with ``harness`` applied (module rules)."""
    out = dict(body)
    messages = list(body.get("messages") or [])
    reef_text = system_text(harness, last_user_text(messages), max_skills)
    if reef_text:
        out["system"] = merge_text(reef_text, body.get("system"))
    examples = [anthropic_message(m) for example in harness.examples for m in example.messages]
    out["messages"] = examples + messages
    tools = merge_tools(body.get("tools"), [anthropic_tool(t) for t in harness.tools], _tool_name)
    tools = annotate_tools(tools, harness.tool_notes, _tool_name, lambda t: (t, "input_schema"))
    if tools is not None:
        out["tools"] = tools
    enforced = ["stop_sequences" if key == "stop" else key for key in harness.enforced_params]
    apply_params(out, body, anthropic_params(harness.params), enforced, _ALIASES)
    choice = harness.orchestration.tool_choice
    if choice is not None and out.get("tools") and body.get("tool_choice") is None:
        out["tool_choice"] = anthropic_tool_choice(choice)
    return out
