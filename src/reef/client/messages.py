"""Rendering an installed harness into an agent's own conversation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reef.harness import MAX_SKILLS, Harness, render_openai


def render_messages(
    harness: Harness, messages: Sequence[dict[str, Any]], *, max_skills: int = MAX_SKILLS
) -> list[dict[str, Any]]:
    """``messages`` (OpenAI chat format) with the harness applied exactly as the gateway
    would: system text (prompt, rules, relevant skills, memory) before the agent's own
    system message, few-shot examples right after it. ``messages`` is not mutated.
    For tools and params too, call ``reef.harness.render_openai`` on the whole body."""
    rendered = render_openai(harness, {"messages": list(messages)}, max_skills=max_skills)
    result: list[dict[str, Any]] = rendered["messages"]
    return result
