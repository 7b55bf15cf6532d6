"""Applying a harness to an OpenAI chat-completions request (pure; run per request).

The rules, shared with :mod:`reef.harness.rendering_anthropic`:

- **System text** = system prompt, then ``## Rules`` (instructions as a bullet list),
  then one ``## Skill: <name>`` section per relevant skill, then ``## Memory`` (facts
  as bullets), separated by blank lines. It goes *before* the client's own system
  message, which is kept (merged into the same message); without a client system
  message a new one is added first. Nothing is added when the text is empty.
- **Relevant skills**: a skill is relevant when one of its keywords appears as a word
  in the last user message. Keywords are the words of the skill's ``name`` and
  ``when_to_use``, lowercased, at least 3 characters, minus a short stop-word list
  (``STOPWORDS``); words are runs of letters and digits (``_``, ``-`` and spaces
  split), compared whole, with a plural ``s`` ignored ("hotels" matches "hotel").
  At most ``max_skills`` (default 3) are used: most matching keywords first, ties by
  declaration order; the chosen ones appear in declaration order.
- **Examples** become prior turns right after the system message, in order.
- **Tools**: the client's tools first; harness tools whose function name no client tool
  uses are appended (a client tool of the same name wins). ``tool_notes`` then rewrite
  the description, and the named parameters' descriptions, of the tools they name,
  the client's included (on copies); nothing else of a client tool changes.
- **Params** are defaults: set only when the client did not send the key (or sent
  ``null``); a key listed in ``enforced_params`` always takes the harness value.
  ``max_tokens`` also counts as sent when the client used ``max_completion_tokens``.
- **tool_choice** (orchestration) is a default, applied only when tools are present.

The input body is never mutated; harness values are copied into the output.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from reef.harness.model import Harness, Skill, ToolNote

MAX_SKILLS = 3
_WORD = re.compile(r"[^\W_]+")
_OPENAI_ALIASES: Mapping[str, tuple[str, ...]] = {
    "max_tokens": ("max_tokens", "max_completion_tokens"),
}


def words(text: str) -> set[str]:
    """The lowercased words (runs of letters and digits) of ``text``, a plural ``s``
    dropped from words of four or more letters ("hotels" → "hotel")."""
    return {w[:-1] if len(w) > 3 and w.endswith("s") else w for w in _WORD.findall(text.lower())}


_STOPWORD_TEXT = """
the and for with when that this from into your you are use using user users asks ask about
any all not but its has have was will can should would what which who how why where there
their them they then than also only just more most some such each other need needs wants
want help
"""
STOPWORDS = frozenset(words(_STOPWORD_TEXT))
"""Words that never make a skill relevant (too common to mean anything)."""


def skill_keywords(skill: Skill) -> frozenset[str]:
    """The words that make ``skill`` relevant (see module docstring)."""
    found = words(skill.name) | words(skill.when_to_use)
    return frozenset(w for w in found if len(w) >= 3 and w not in STOPWORDS)


def relevant_skills(harness: Harness, text: str, max_skills: int = MAX_SKILLS) -> list[Skill]:
    """The skills relevant to the user text ``text``, at most ``max_skills``."""
    if not harness.skills or max_skills <= 0:
        return []
    present = words(text)
    scored = []
    for index, skill in enumerate(harness.skills):
        hits = len(skill_keywords(skill) & present)
        if hits:
            scored.append((-hits, index))
    chosen = sorted(index for _, index in sorted(scored)[:max_skills])
    return [harness.skills[index] for index in chosen]


def system_text(harness: Harness, user_text: str, max_skills: int = MAX_SKILLS) -> str:
    """The harness's system text for a request whose last user message is
    ``user_text`` (empty when the harness adds nothing)."""
    sections: list[str] = []
    if harness.system_prompt and harness.system_prompt.strip():
        sections.append(harness.system_prompt.strip())
    if harness.instructions:
        sections.append("## Rules\n" + "\n".join(f"- {rule}" for rule in harness.instructions))
    for skill in relevant_skills(harness, user_text, max_skills):
        parts = [f"## Skill: {skill.name}"]
        if skill.description:
            parts.append(skill.description.strip())
        parts.append(skill.content.strip())
        sections.append("\n".join(parts))
    if harness.memory:
        sections.append("## Memory\n" + "\n".join(f"- {fact}" for fact in harness.memory))
    return "\n\n".join(sections)


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the ``text`` of its text parts
    (OpenAI ``{"type": "text"}`` parts and Anthropic text blocks alike)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and "text" in part
        )
    return ""


def last_user_text(messages: Sequence[Any]) -> str:
    """The text of the last ``user`` message (empty when there is none)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def merge_text(reef_text: str, content: Any) -> Any:
    """Reef's text first, then the client's own system content (string or parts)."""
    if isinstance(content, list):
        return [{"type": "text", "text": reef_text}, *content]
    if isinstance(content, str) and content:
        return f"{reef_text}\n\n{content}"
    return reef_text


def merge_tools(
    client: Any, harness_tools: Sequence[dict[str, Any]], name_of: Any
) -> list[Any] | None:
    """The client's tools plus the harness tools (already in the dialect's shape) whose
    name no client tool has; ``None`` when there is nothing to set. ``name_of`` maps a
    client tool to its name (or ``None``). A malformed (non-list) client value is left
    for the upstream to reject."""
    if client is not None and not isinstance(client, list):
        return None
    client_tools = list(client or [])
    taken = {name_of(tool) for tool in client_tools}
    extra = [tool for tool in harness_tools if name_of(tool) not in taken]
    if not extra and client is None:
        return None
    return client_tools + copy.deepcopy(extra)


def annotate_tools(
    tools: list[Any] | None,
    notes: Mapping[str, ToolNote],
    name_of: Any,
    schema_of: Any,
) -> list[Any] | None:
    """``tools`` with ``notes`` applied (module rules), each changed tool a copy.
    ``schema_of(tool)`` gives the dict holding the tool's ``description`` and the key of
    its JSON schema there (``parameters``, ``input_schema``)."""
    if not tools or not notes:
        return tools
    out = []
    for tool in tools:
        note = notes.get(name_of(tool)) if isinstance(tool, dict) else None
        if note is None:
            out.append(tool)
            continue
        tool = copy.deepcopy(tool)
        holder, schema_key = schema_of(tool)
        if note.description is not None:
            holder["description"] = note.description
        schema = holder.get(schema_key)
        properties = schema.get("properties") if isinstance(schema, dict) else None
        for parameter, text in note.parameters.items():
            if isinstance(properties, dict) and isinstance(properties.get(parameter), dict):
                properties[parameter]["description"] = text
        out.append(tool)
    return out


def _openai_schema(tool: dict[str, Any]) -> tuple[dict[str, Any], str]:
    function = tool.setdefault("function", {})
    return function, "parameters"


def apply_params(
    out: dict[str, Any],
    body: Mapping[str, Any],
    params: Mapping[str, Any],
    enforced: Sequence[str],
    aliases: Mapping[str, tuple[str, ...]],
) -> None:
    """Set ``params`` on ``out``: defaults unless ``enforced`` (see module docstring).
    ``aliases`` lists, per param, the request keys that carry it."""
    for key, value in params.items():
        sent = [name for name in aliases.get(key, (key,)) if body.get(name) is not None]
        if not sent:
            out[key] = copy.deepcopy(value)
        elif key in enforced:
            for name in sent:
                out[name] = copy.deepcopy(value)


def _openai_tool_name(tool: Any) -> str | None:
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


def render_openai(
    harness: Harness, body: Mapping[str, Any], *, max_skills: int = MAX_SKILLS
) -> dict[str, Any]:
    """A new chat-completions body: ``body`` with ``harness`` applied (module rules)."""
    out = dict(body)
    messages = list(body.get("messages") or [])
    reef_text = system_text(harness, last_user_text(messages), max_skills)
    head: list[Any] = []
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        messages.pop(0)
        head = [{**first, "content": merge_text(reef_text, first.get("content"))}]
        if not reef_text:
            head = [first]
    elif reef_text:
        head = [{"role": "system", "content": reef_text}]
    examples = [m for example in harness.examples for m in copy.deepcopy(example.messages)]
    out["messages"] = head + examples + messages
    tools = merge_tools(body.get("tools"), harness.tools, _openai_tool_name)
    tools = annotate_tools(tools, harness.tool_notes, _openai_tool_name, _openai_schema)
    if tools is not None:
        out["tools"] = tools
    apply_params(out, body, harness.params, harness.enforced_params, _OPENAI_ALIASES)
    choice = harness.orchestration.tool_choice
    if choice is not None and out.get("tools") and body.get("tool_choice") is None:
        out["tool_choice"] = copy.deepcopy(choice)
    return out
