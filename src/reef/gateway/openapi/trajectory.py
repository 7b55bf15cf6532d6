"""JSON schemas of ``GET /reef/scenarios/{s}/sessions/{id}``'s answer for the OpenAPI
document: the session's records and its trajectory tree (``reef.experience.trajectories``
builds it; ``tests/gateway/test_trajectory_route.py`` validates a real answer against
these schemas, so the two cannot drift)."""

from __future__ import annotations

from typing import Any

_REF = "#/components/schemas/"
_ID = {"type": "string"}
_NULLABLE_ID = {"type": ["string", "null"]}
_OBJECTS = {"type": "array", "items": {"type": "object"}}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF + name}


def _object(description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "required": sorted(properties),
    }


_MESSAGE = {
    "type": "object",
    "description": "A message in canonical form: `role`, `content` (text; a non-text part "
    "as `[type sha256:…]`), `tool_calls` (`id`, `name`, `arguments` as compact sorted-key "
    "JSON), `tool_call_id`, `name`; empty fields are left out.",
    "properties": {
        "role": {"type": "string"},
        "content": {"type": "string"},
        "tool_calls": {"type": "array", "items": _ref("TrajectoryToolCall")},
        "tool_call_id": {"type": "string"},
        "name": {"type": "string"},
    },
    "required": ["role"],
}

_TOOL_CALL = {
    "type": "object",
    "description": "A tool call of an assistant message.",
    "properties": {"id": _ID, "name": _ID, "arguments": {"type": "string"}},
}

_REPLY = {"oneOf": [_ref("TrajectoryMessage"), {"type": "null"}]}

_ATTEMPT = _object(
    "One record that sent the turn's request (a retry adds one).",
    {
        "record_id": _ID,
        "status": {"enum": ["ok", "error", "aborted"]},
        "error": {"type": ["string", "null"]},
        "reply": _REPLY,
        "release_id": _NULLABLE_ID,
        "purpose": {"enum": ["serve", "eval", "canary", "judge", "shadow"]},
        "created_at": {"type": "string", "format": "date-time"},
        "feedback": _OBJECTS,
    },
)

_TOOL_RESULT = _object(
    "A tool result the request carried, with the call it answers (null when no "
    "assistant message of the conversation made a call with that id).",
    {
        "tool_call_id": _NULLABLE_ID,
        "content": {"type": "string"},
        "call": {"oneOf": [_ref("TrajectoryToolCall"), {"type": "null"}]},
    },
)

_TURN = _object(
    "One distinct request of the session and its reply.",
    {
        "id": {"type": "string", "description": "The first record that sent this request."},
        "index": {"type": "integer", "description": "Order of first appearance."},
        "depth": {"type": "integer", "description": "0 for a root, parent's depth + 1."},
        "api": {"type": "string"},
        "parent": {**_NULLABLE_ID, "description": "The turn this one continues."},
        "parent_record_id": {**_NULLABLE_ID, "description": "The attempt it continues."},
        "link": {
            "enum": ["start", "continues", "system_changed", "compacted"],
            "description": "How the parent was found: none; the whole earlier conversation "
            "is a prefix; it is once system messages are left out; the history was "
            "truncated or summarised.",
        },
        "children": {"type": "array", "items": _ID},
        "record_id": {**_ID, "description": "The newest successful attempt, else the newest."},
        "status": {"enum": ["ok", "error", "aborted"]},
        "reply": _REPLY,
        "system": {"type": ["string", "null"]},
        "system_changed": {"type": "boolean"},
        "tools": {**_OBJECTS, "description": "Tools offered, OpenAI function form."},
        "tool_choice": {},
        "new_messages": {
            "type": "array",
            "items": _ref("TrajectoryMessage"),
            "description": "What the request added after the parent's reply.",
        },
        "tool_results": {"type": "array", "items": _ref("TrajectoryToolResult")},
        "messages": {
            "type": "array",
            "items": _ref("TrajectoryMessage"),
            "description": "The request's whole conversation.",
        },
        "retries": {"type": "integer", "minimum": 0},
        "attempts": {"type": "array", "items": _ref("TrajectoryAttempt")},
    },
)

_BRANCH = _object(
    "A path from a root turn to a leaf, with the record that answered each turn.",
    {
        "turns": {"type": "array", "items": _ID},
        "records": {"type": "array", "items": _ID},
        "leaf": _ID,
    },
)

_TRAJECTORY = _object(
    "The session's trajectory tree.",
    {
        "scenario": _ID,
        "session_id": _ID,
        "roots": {"type": "array", "items": _ID},
        "turns": {"type": "array", "items": _ref("TrajectoryTurn")},
        "branches": {"type": "array", "items": _ref("TrajectoryBranch")},
        "main_branch": {
            "oneOf": [_ref("TrajectoryBranch"), {"type": "null"}],
            "description": "The branch ending in the newest attempt (where the task ended).",
        },
        "outcomes": {**_OBJECTS, "description": "Feedback given on the session as a whole."},
    },
)

_SESSION = _object(
    "A session: its records in turn order and its trajectory.",
    {
        "scenario": _ID,
        "session_id": _ID,
        "turns": {**_OBJECTS, "description": "The session's records, in turn order."},
        "trajectory": _ref("Trajectory"),
    },
)


def trajectory_schemas() -> dict[str, Any]:
    """The component schemas, by name."""
    return {
        "Session": _SESSION,
        "Trajectory": _TRAJECTORY,
        "TrajectoryTurn": _TURN,
        "TrajectoryBranch": _BRANCH,
        "TrajectoryAttempt": _ATTEMPT,
        "TrajectoryToolResult": _TOOL_RESULT,
        "TrajectoryMessage": _MESSAGE,
        "TrajectoryToolCall": _TOOL_CALL,
    }
