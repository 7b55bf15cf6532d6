"""Checks of an OpenAI Responses request body, before Reef translates any of it.

Unlike the chat and messages bodies, which go upstream as sent, a Responses body is
translated into chat completions (``reef.upstream.responses.translate``), so every field is
Reef's to understand: a field, item type, content part or tool the translation cannot
carry is refused with a 400 naming it (``InvalidFieldError``), never dropped silently.
Fields that change nothing the upstream sees (``store``, ``metadata``, ``service_tier``
…) are accepted. ``null`` counts as absent.
"""

from __future__ import annotations

from typing import Any, Final

from reef.gateway.body_checks import (
    MAX_COUNT,
    check_integer,
    check_number,
    optional_boolean,
    optional_string,
    refuse,
    require_array,
    require_object,
    shown,
)
from reef.gateway.errors import InvalidFieldError

# Accepted as they are: Reef's own (store, previous_response_id) or without effect on
# what a chat-completions upstream is asked.
_ACCEPTED: Final = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_output_tokens",
        "text",
        "metadata",
        "store",
        "previous_response_id",
        "stream",
        "stream_options",
        "parallel_tool_calls",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "truncation",
        "include",
        "reasoning",
        "background",
    }
)
# Fields Reef knows but cannot honour on a chat-completions upstream: refused when set.
UNSUPPORTED_FIELDS: Final = {
    "conversation": "conversations are not kept by Reef; chain turns with previous_response_id",
    "prompt": "stored prompt templates are not kept by Reef; send instructions and input",
    "top_logprobs": "log probabilities are not translated to the Responses API",
    "max_tool_calls": "Reef runs no built-in tools, so it cannot bound their calls",
    "prompt_cache_retention": "prompt cache settings are not translated",
}
ITEM_TYPES: Final = ("message", "function_call", "function_call_output")
_ROLES: Final = ("user", "assistant", "system", "developer")
_TEXT_PARTS: Final = ("input_text", "output_text")
TOOL_CHOICES: Final = ("auto", "none", "required")
FORMAT_TYPES: Final = ("text", "json_object", "json_schema")
REASONING_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh")
_CHAT_ONLY = "only message, function_call and function_call_output items can be translated"


def check_openai_responses(body: dict[str, Any]) -> None:
    """Raise ``InvalidFieldError`` unless every field of a Responses body is one Reef
    translates (or may ignore) and has the type the OpenAI API gives it."""
    for key, value in body.items():
        if value is None:
            continue
        if key in UNSUPPORTED_FIELDS:
            raise InvalidFieldError(key, f"'{key}' is not supported: {UNSUPPORTED_FIELDS[key]}")
        if key not in _ACCEPTED:
            raise InvalidFieldError(key, f"'{key}' is not a field Reef's /v1/responses knows")
    for key in ("model", "instructions", "previous_response_id", "user"):
        optional_string(body, key, None)
    for key in ("stream", "store", "parallel_tool_calls"):
        optional_boolean(body, key, None)
    if body.get("background"):
        raise InvalidFieldError("background", "'background' responses are not supported")
    check_number(body, "temperature", 0, 2)
    check_number(body, "top_p", 0, 1)
    check_integer(body, "max_output_tokens", 1, MAX_COUNT)
    _input(body.get("input"))
    for index, tool in enumerate(_optional_list(body, "tools")):
        _tool(tool, f"tools[{index}]")
    _tool_choice(body.get("tool_choice"))
    _text(body.get("text"))
    _metadata(body.get("metadata"))
    _settings(body)


def _optional_list(body: dict[str, Any], key: str) -> list[Any]:
    value = body.get(key)
    return [] if value is None else require_array(value, key)


def _input(value: Any) -> None:
    if value is None:
        raise InvalidFieldError("input", "request body is missing 'input'")
    if isinstance(value, str):
        return
    items = require_array(value, "input", "a string or an array of items")
    if not items:
        raise InvalidFieldError("input", "'input' must be a string or a non-empty array")
    for index, item in enumerate(items):
        _item(item, f"input[{index}]")


def _item(value: Any, where: str) -> None:
    item = require_object(value, where, "an input item (an object)")
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"
    if not isinstance(kind, str):
        refuse(f"{where}.type", "a string", kind)
    if kind not in ITEM_TYPES:
        raise InvalidFieldError(
            f"{where}.type",
            f"input item type {shown(kind)} ({where}) is not supported: {_CHAT_ONLY} "
            "to a chat-completions upstream",
        )
    if kind == "message":
        _message(item, where)
    elif kind == "function_call":
        for key in ("call_id", "name", "arguments"):
            _required_string(item, key, where)
    else:
        _required_string(item, "call_id", where)
        output = item.get("output")
        if not isinstance(output, str):
            for index, part in enumerate(
                require_array(output, f"{where}.output", "a string or an array of input_text parts")
            ):
                _part(part, f"{where}.output[{index}]", ("input_text",))


def _message(item: dict[str, Any], where: str) -> None:
    role = item.get("role")
    if role not in _ROLES:
        expected = f"one of {', '.join(_ROLES)}"
        raise InvalidFieldError(
            f"{where}.role", f"'{where}.role' must be {expected}, not {shown(role)}"
        )
    content = item.get("content")
    if isinstance(content, str):
        return
    for index, part in enumerate(
        require_array(content, f"{where}.content", "a string or an array of content parts")
    ):
        _part(part, f"{where}.content[{index}]", (*_TEXT_PARTS, "refusal", "input_image"))


def _part(value: Any, where: str, allowed: tuple[str, ...]) -> None:
    part = require_object(value, where, "a content part (an object with a 'type')")
    kind = part.get("type")
    if kind not in allowed:
        raise InvalidFieldError(
            f"{where}.type",
            f"content part type {shown(kind)} ({where}) is not supported here; "
            f"Reef translates {', '.join(allowed)}",
        )
    if kind in _TEXT_PARTS:
        _required_string(part, "text", where)
    elif kind == "refusal":
        _required_string(part, "refusal", where)
    elif kind == "input_image" and (
        part.get("file_id") is not None or not isinstance(part.get("image_url"), str)
    ):
        raise InvalidFieldError(
            f"{where}.image_url",
            f"'{where}' must give its image as 'image_url' (a URL or data URL); "
            "uploaded files (file_id) are not kept by Reef",
        )


def _tool(value: Any, where: str) -> None:
    tool = require_object(value, where, "a tool (an object with a 'type')")
    kind = tool.get("type")
    if kind != "function":
        raise InvalidFieldError(
            f"{where}.type",
            f"tool type {shown(kind)} ({where}) is not supported: Reef runs no built-in "
            "tools (web_search, file_search, computer_use, code_interpreter, …); only "
            "function tools are translated",
        )
    _required_string(tool, "name", where)
    optional_string(tool, "description", where)
    optional_boolean(tool, "strict", where)
    if tool.get("parameters") is not None:
        require_object(tool["parameters"], f"{where}.parameters")


def _tool_choice(choice: Any) -> None:
    if choice is None or choice in TOOL_CHOICES:
        return
    if isinstance(choice, dict) and choice.get("type") == "function":
        _required_string(choice, "name", "tool_choice")
        return
    raise InvalidFieldError(
        "tool_choice",
        f"'tool_choice' must be one of {', '.join(TOOL_CHOICES)} or "
        '{"type": "function", "name": ...}; built-in tool choices are not supported',
    )


def _text(value: Any) -> None:
    if value is None:
        return
    text = require_object(value, "text")
    for key, setting in text.items():
        if key != "format" and setting is not None:
            raise InvalidFieldError(f"text.{key}", f"'text.{key}' is not supported")
    fmt = text.get("format")
    if fmt is None:
        return
    fmt = require_object(fmt, "text.format")
    kind = fmt.get("type")
    if kind not in FORMAT_TYPES:
        raise InvalidFieldError(
            "text.format.type",
            f"'text.format.type' must be one of {', '.join(FORMAT_TYPES)}, not {shown(kind)}",
        )
    if kind == "json_schema":
        _required_string(fmt, "name", "text.format")
        require_object(fmt.get("schema"), "text.format.schema")
        optional_string(fmt, "description", "text.format")
        optional_boolean(fmt, "strict", "text.format")


def _metadata(value: Any) -> None:
    if value is None:
        return
    for key, item in require_object(value, "metadata").items():
        if not isinstance(item, str):
            refuse(f"metadata.{key}", "a string", item)


def _settings(body: dict[str, Any]) -> None:
    """``truncation``, ``include`` and ``reasoning``: accepted where they ask for
    nothing Reef would have to drop."""
    truncation = body.get("truncation")
    if truncation is not None and truncation != "disabled":
        raise InvalidFieldError(
            "truncation",
            f"'truncation' must be 'disabled', not {shown(truncation)}: Reef never "
            "drops turns from a conversation",
        )
    include = body.get("include")
    if include is not None and require_array(include, "include"):
        raise InvalidFieldError(
            "include",
            f"'include' values are not supported (sent: {shown(include[0])}): reasoning "
            "content, logprobs and built-in tool outputs are not translated",
        )
    reasoning = body.get("reasoning")
    if reasoning is None:
        return
    reasoning = require_object(reasoning, "reasoning")
    for key in ("summary", "generate_summary"):
        if reasoning.get(key) is not None:
            raise InvalidFieldError(
                f"reasoning.{key}", f"'reasoning.{key}' is not supported: no reasoning items"
            )
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        refuse("reasoning.effort", f"one of {', '.join(REASONING_EFFORTS)}", effort)


def _required_string(owner: dict[str, Any], key: str, where: str) -> None:
    if not isinstance(owner.get(key), str):
        refuse(f"{where}.{key}", "a string", owner.get(key))


def check_responses_for_anthropic(body: dict[str, Any]) -> None:
    """Raise ``InvalidFieldError`` for what a checked Responses body asks that the
    Anthropic Messages API cannot do: a ``text.format`` other than text (it has no
    structured output mode), a ``reasoning.effort`` (its thinking is no reasoning
    item Reef translates), a ``temperature`` above 1 (its range is 0-1)."""
    fmt = (body.get("text") or {}).get("format") or {}
    if fmt.get("type") not in (None, "text"):
        raise InvalidFieldError(
            "text.format.type",
            f"'text.format.type' {shown(fmt.get('type'))} is not supported on an Anthropic "
            "upstream: the Messages API has no JSON output mode to translate it to",
        )
    if (body.get("reasoning") or {}).get("effort") is not None:
        raise InvalidFieldError(
            "reasoning.effort",
            "'reasoning.effort' is not supported on an Anthropic upstream: reasoning "
            "(extended thinking) is not translated",
        )
    temperature = body.get("temperature")
    if temperature is not None and temperature > 1:
        raise InvalidFieldError(
            "temperature",
            f"'temperature' must be at most 1 on an Anthropic upstream, not {temperature}",
        )
