"""What the model learners read out of a ``TrainingExample`` as plain text: the
conversation, the served reply and the correction (shared by sft, preference and rl)."""

from __future__ import annotations

from typing import Any

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
