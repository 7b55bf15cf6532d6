"""Tool calls as a model sends them, checked before anything runs.

A model may send anything: a call that is not an object, no id, an unknown tool,
arguments that are not JSON or not an object, a required argument missing. None of that
is a crash: ``parse_call`` turns each into the text of a tool result the model can read
and recover from. ``normalize_call`` gives every call (even a broken one) the id and
shape its tool result answers, so the conversation stays valid for the next request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema  # type: ignore[import-untyped]

TRUNCATION_MARKER = "\n[... output truncated by the environment: {shown} of {total} characters]"


@dataclass(frozen=True)
class ParsedCall:
    """A well-formed call of an offered tool."""

    id: str
    name: str
    arguments: dict[str, Any]


def normalize_call(raw: Any, index: int) -> dict[str, Any]:
    """``raw`` in OpenAI form with a string ``id`` (``call_<index>`` when it has none),
    a string ``function.name`` (``invalid`` when it has none) and string
    ``function.arguments``: what the assistant message carries back to the model."""
    call: dict[str, Any] = raw if isinstance(raw, dict) else {}
    function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
    call_id = call.get("id")
    name = function.get("name")
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False, default=str)
    return {
        "id": call_id if isinstance(call_id, str) and call_id else f"call_{index}",
        "type": "function",
        "function": {
            "name": name if isinstance(name, str) and name else "invalid",
            "arguments": arguments,
        },
    }


def parse_call(raw: Any, index: int, offered: Mapping[str, dict[str, Any]]) -> ParsedCall | str:
    """The call ``raw`` (the ``index``-th of its reply) checked against the ``offered``
    tools (name -> OpenAI ``function`` spec): a ``ParsedCall``, or the text of the
    tool result that says what is wrong with it."""
    if not isinstance(raw, dict):
        return f"error: tool call #{index} is not an object (got {type(raw).__name__})"
    if raw.get("type", "function") != "function":
        return (
            f"error: tool call #{index} has type {raw.get('type')!r}; only 'function' is supported"
        )
    function = raw.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return f"error: tool call #{index} has no function name"
    name = function["name"]
    spec = offered.get(name)
    if spec is None:
        known = ", ".join(sorted(offered)) or "(none)"
        return f"error: unknown tool {name!r}; the tools offered are: {known}"
    arguments = _arguments(function.get("arguments"), name)
    if isinstance(arguments, str):
        return arguments
    problem = schema_problem(arguments, spec.get("parameters"))
    if problem is not None:
        return f"error: the arguments of {name!r} do not fit its parameters: {problem}"
    return ParsedCall(normalize_call(raw, index)["id"], name, arguments)


def cap_output(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters with a marker saying so, and whether it was
    cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + TRUNCATION_MARKER.format(shown=limit, total=len(text)), True


def _arguments(raw: Any, name: str) -> dict[str, Any] | str:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return f"error: the arguments of {name!r} must be a JSON object string"
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return f"error: the arguments of {name!r} are not valid JSON ({exc}): {raw[:200]!r}"
    if not isinstance(value, dict):
        return f"error: the arguments of {name!r} must be a JSON object, got {type(value).__name__}"
    return value


def schema_problem(document: Any, schema: Any) -> str | None:
    """What is wrong with ``document`` against the JSON ``schema`` (draft 2020-12), or
    None when it validates or ``schema`` is not an object."""
    if not isinstance(schema, dict):
        return None
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(_describe(error) for error in errors[:5])


def _describe(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
