"""Corrections that are tool calls: checking them when feedback arrives, and their
canonical form for learning.

A correction is free-form (usually the text the answer should have been), except one
that is an object with ``tool_calls``: the assistant turn should have called tools. Each
call is OpenAI's ``{"type": "function", "function": {"name", "arguments"}}`` (an ``id``
optional) or the flat ``{"name", "arguments"}``; ``arguments`` is a JSON object or its
text; ``content`` beside the calls is optional text. ``check_correction`` refuses other
shapes naming the field; ``canonical_correction`` gives the assistant message in the
canonical form replies are in (``reef.upstream.canonical``), so a learner compares a
corrected call with a served one field for field.
"""

from __future__ import annotations

from typing import Any

from reef.core.errors import InvalidInputError
from reef.core.jsoncodec import loads
from reef.upstream.canonical import canonical_message


def is_tool_call_correction(value: Any) -> bool:
    """Whether ``value`` is a correction made of tool calls."""
    return isinstance(value, dict) and "tool_calls" in value


def check_correction(value: Any) -> None:
    """Raise ``InvalidInputError`` naming the field when ``value`` is a malformed
    tool-call correction; any other correction passes."""
    if not is_tool_call_correction(value):
        return
    content = value.get("content")
    if content is not None and not isinstance(content, str):
        raise InvalidInputError("correction.content must be text or null")
    calls = value["tool_calls"]
    if not isinstance(calls, list) or not calls:
        raise InvalidInputError("correction.tool_calls must be a non-empty list of tool calls")
    for index, call in enumerate(calls):
        _check_call(call, f"correction.tool_calls[{index}]")


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise InvalidInputError(f"{where} must be an object")
    function = call.get("function", call)
    if "function" in call:
        where += ".function"
        if not isinstance(function, dict):
            raise InvalidInputError(f"{where} must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"{where}.name must be a non-empty string")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads(arguments)
        except ValueError as error:
            raise InvalidInputError(f"{where}.arguments is not JSON: {error}") from error
    if not isinstance(arguments, dict):
        raise InvalidInputError(f"{where}.arguments must be a JSON object (or its text)")
    if call.get("id") is not None and not isinstance(call.get("id"), str):
        raise InvalidInputError(f"{where.removesuffix('.function')}.id must be a string")


def canonical_correction(value: Any) -> Any:
    """A tool-call correction as a canonical assistant message (``role``, ``content``
    when given, ``tool_calls`` of ``id``/``name``/``arguments``); anything else as it is."""
    if not is_tool_call_correction(value):
        return value
    calls = []
    for call in value["tool_calls"]:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        openai_call = {
            "type": "function",
            "function": {"name": function.get("name"), "arguments": arguments},
        }
        if call.get("id"):
            openai_call["id"] = call["id"]
        calls.append(openai_call)
    return canonical_message(
        {"role": "assistant", "content": value.get("content"), "tool_calls": calls}
    )
