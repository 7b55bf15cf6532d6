"""The harness: everything around the model that shapes a request (``harness.yaml``)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SKILL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}")
_EXAMPLE_ROLES = frozenset({"user", "assistant", "tool"})
_TOOL_CHOICES = frozenset({"auto", "none", "required"})
STRUCTURAL_KEYS = frozenset(
    {"messages", "model", "tools", "tool_choice", "stream", "system", "functions"}
)
"""Request keys a harness may not set through ``params`` (they have their own fields)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Example(_Frozen):
    """One few-shot demonstration: OpenAI-style messages (user, assistant, tool)."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tags: list[str] = Field(default_factory=list)

    @field_validator("messages")
    @classmethod
    def _message_shape(cls, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, message in enumerate(messages):
            role = message.get("role")
            if role not in _EXAMPLE_ROLES:
                raise ValueError(
                    f"message {index}: role must be one of {sorted(_EXAMPLE_ROLES)}, "
                    f"got {role!r} (the system prompt belongs in system_prompt)"
                )
            content = message.get("content")
            if not (content is None or isinstance(content, str | list)):
                raise ValueError(f"message {index}: content must be a string or a list")
            if role == "tool" and not isinstance(message.get("tool_call_id"), str):
                raise ValueError(f"message {index}: a tool message needs tool_call_id")
        return messages


class Skill(_Frozen):
    """A piece of know-how added to the system prompt when the request calls for it."""

    name: str
    description: str = ""
    when_to_use: str = ""
    content: str

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _SKILL_NAME.fullmatch(name):
            raise ValueError(f"skill name {name!r}: 1-64 of letters, digits, space, _ . -")
        return name


class ToolNote(_Frozen):
    """A better description of one tool, whoever offers it (``Harness.tool_notes``):
    ``description`` replaces the tool's, ``parameters`` sets the description of each
    named parameter the tool's schema has."""

    description: str | None = None
    parameters: dict[str, str] = Field(default_factory=dict)


class Orchestration(_Frozen):
    """How an agent loop should run (``max_turns`` is advisory, for client-side loops)."""

    max_turns: int | None = Field(default=None, ge=1)
    tool_choice: str | dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if isinstance(choice, str) and choice not in _TOOL_CHOICES:
            raise ValueError(f"tool_choice must be one of {sorted(_TOOL_CHOICES)} or an object")
        return choice


def check_tool(tool: Any, where: str = "tool") -> str:
    """Return the function name of an OpenAI function tool
    (``{"type": "function", "function": {"name", "description"?, "parameters"?}}``);
    raises ``ValueError`` naming what is wrong."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise ValueError(f"{where}: must be an object with type 'function'")
    if set(tool) - {"type", "function"}:
        raise ValueError(f"{where}: unexpected keys {sorted(set(tool) - {'type', 'function'})}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise ValueError(f"{where}: 'function' must be an object")
    name = function.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise ValueError(f"{where}: function name {name!r} must be 1-64 of [A-Za-z0-9_-]")
    if not isinstance(function.get("description", ""), str):
        raise ValueError(f"{where}: function description must be a string")
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise ValueError(f"{where}: function parameters must be a JSON schema of type object")
    return name


def _check_params(params: dict[str, Any]) -> None:
    structural = sorted(STRUCTURAL_KEYS & set(params))
    if structural:
        raise ValueError(f"params may not set {structural} (use tools/orchestration)")
    for key in ("temperature", "top_p"):
        value = params.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"params.{key} must be a number")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ValueError("params.max_tokens must be a positive integer")
    stop = params.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise ValueError("params.stop must be a string or a list of strings")


class Harness(_Frozen):
    """The contents of ``harness.yaml`` (schema version 1)."""

    schema_version: Literal[1]
    system_prompt: str | None = None
    instructions: list[str] = Field(default_factory=list)
    examples: list[Example] = Field(default_factory=list)
    skills: list[Skill] = Field(default_factory=list)
    memory: list[str] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_notes: dict[str, ToolNote] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    enforced_params: list[str] = Field(default_factory=list)
    orchestration: Orchestration = Field(default_factory=Orchestration)

    @model_validator(mode="after")
    def _consistent(self) -> Harness:
        names = [check_tool(tool, f"tools[{i}]") for i, tool in enumerate(self.tools)]
        if len(names) != len(set(names)):
            raise ValueError(f"tool names must be unique, got {names}")
        skills = [skill.name for skill in self.skills]
        if len(skills) != len(set(skills)):
            raise ValueError(f"skill names must be unique, got {skills}")
        _check_params(self.params)
        missing = sorted(set(self.enforced_params) - set(self.params))
        if missing:
            raise ValueError(f"enforced_params {missing} have no value in params")
        return self
