"""One record as a dialect-free exchange: conversation, tools offered, reply.

Trajectories (``reef.experience.trajectories``) are assembled on this form only, so a
dialect is supported once it has a ``Canonicaliser`` here: a function from a record's
request and response to a ``CanonicalExchange``. Messages and replies are in the
canonical conversation form of ``reef.upstream.canonical`` (the form session inference
hashes), so what links two records into a trajectory is exactly what put them in one
session; tools are in OpenAI function form (``{"type": "function", "function": {...}}``),
with a dialect's tools that have no function form (Anthropic's server tools) kept as
sent.

A legacy text completion (``openai.completions``) is its prompt as the user's message
and its text as the reply. An embeddings record (``openai.embeddings``) is its input
with no reply, and is no training example: ``TRAINABLE_APIS`` names the apis whose
records are prompt-and-answer exchanges that learning may select.

``chat_messages`` is the other view of a record's conversation: the whole of it in
OpenAI chat form, translated from the record's own request with the gateway's
translators, so images, content parts and tool history survive (the canonical form
digests what is not text). It is what a replay sends to ``/v1/chat/completions``.

Extend: a new ``api`` value of ``RecordDraft`` registers its canonicaliser in
``CANONICALISERS`` (a record of an unregistered api raises ``InvalidInputError``), and
joins ``TRAINABLE_APIS`` when its records are answers to learn from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reef.core.errors import InvalidInputError
from reef.experience.records import RecordView
from reef.upstream.canonical import (
    canonical_anthropic,
    canonical_completions,
    canonical_embeddings,
    canonical_openai,
    canonical_reply_anthropic,
    canonical_reply_completions,
    canonical_reply_openai,
    canonical_reply_responses,
    canonical_responses,
    openai_chat_messages,
)
from reef.upstream.responses.translate import responses_request_to_openai
from reef.upstream.translate import anthropic_request_to_openai


@dataclass(frozen=True)
class CanonicalExchange:
    """A request's conversation (system prompt first), the tools it offered and its
    ``tool_choice`` (OpenAI form), and the reply (``None`` when there was none)."""

    messages: list[dict[str, Any]]
    reply: dict[str, Any] | None
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None


Canonicaliser = Callable[[dict[str, Any], dict[str, Any] | None], CanonicalExchange]


def _openai_chat(request: dict[str, Any], response: dict[str, Any] | None) -> CanonicalExchange:
    reply = canonical_reply_openai(response) if response else None
    tools = [dict(tool) for tool in request.get("tools") or () if isinstance(tool, dict)]
    return CanonicalExchange(canonical_openai(request), reply, tools, request.get("tool_choice"))


def _anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    if "input_schema" not in tool:
        return dict(tool)  # a server tool (web search, code execution): no function form
    function: dict[str, Any] = {"name": tool.get("name", ""), "parameters": tool["input_schema"]}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _anthropic_messages(
    request: dict[str, Any], response: dict[str, Any] | None
) -> CanonicalExchange:
    reply = canonical_reply_anthropic(response) if response else None
    tools = [_anthropic_tool(tool) for tool in request.get("tools") or () if isinstance(tool, dict)]
    choice = anthropic_request_to_openai(request, model="").get("tool_choice")
    return CanonicalExchange(canonical_anthropic(request), reply, tools, choice)


def _openai_responses(
    request: dict[str, Any], response: dict[str, Any] | None
) -> CanonicalExchange:
    reply = canonical_reply_responses(response) if response else None
    # The chat-completions form of its tools and tool_choice, as the gateway sent them on.
    chat = responses_request_to_openai(request, model="")
    tools = [dict(tool) for tool in chat.get("tools") or ()]
    return CanonicalExchange(canonical_responses(request), reply, tools, chat.get("tool_choice"))


def _openai_completions(
    request: dict[str, Any], response: dict[str, Any] | None
) -> CanonicalExchange:
    reply = canonical_reply_completions(response, request) if response else None
    return CanonicalExchange(canonical_completions(request), reply)


def _openai_embeddings(
    request: dict[str, Any], response: dict[str, Any] | None
) -> CanonicalExchange:
    return CanonicalExchange(canonical_embeddings(request), None)


CANONICALISERS: dict[str, Canonicaliser] = {
    "openai.chat": _openai_chat,
    "anthropic.messages": _anthropic_messages,
    "openai.responses": _openai_responses,
    "openai.completions": _openai_completions,
    "openai.embeddings": _openai_embeddings,
}

TRAINABLE_APIS: frozenset[str] = frozenset(
    {"openai.chat", "anthropic.messages", "openai.responses", "openai.completions"}
)
"""The apis whose records answer a prompt, so learning may train on them (not
``openai.embeddings``: a vector is no answer to imitate)."""


def chat_messages(
    record: RecordView, canonical: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The conversation of ``record``'s request in OpenAI chat form, lossless: the
    request's own messages (chat), or its translation by the gateway's code (Anthropic
    Messages, Responses, whose stored request holds the whole conversation,
    ``previous_response_id`` resolved). Where that does not read back as the record's
    canonical conversation (a legacy completion, an embeddings input, a request stored
    in a form the translators do not know), the canonical messages rendered back.

    ``canonical`` is the record's canonical conversation when the caller has it. Raises
    ``InvalidInputError`` for an ``api`` with no canonicaliser."""
    chat = _request_chat(record)
    if chat is not None:
        rendered = openai_chat_messages(chat)
        # Unchanged by rendering, they read back as the record's canonical conversation
        # by construction (it is computed from these very messages); changed, checked.
        if rendered == chat:
            return rendered
        if canonical is None:
            canonical = canonical_exchange(record).messages
        if canonical_openai({"messages": rendered}) == canonical:
            return rendered
    if canonical is None:
        canonical = canonical_exchange(record).messages
    return openai_chat_messages(canonical)


def _request_chat(record: RecordView) -> list[dict[str, Any]] | None:
    """The chat messages of a chat, Anthropic or Responses request; None for other apis
    or a request whose messages are not a list of objects."""
    if record.api == "anthropic.messages":
        chat = anthropic_request_to_openai(record.request, model="").get("messages")
    elif record.api == "openai.responses":
        chat = responses_request_to_openai(record.request, model="").get("messages")
    elif record.api == "openai.chat":
        chat = record.request.get("messages")
    else:
        return None
    if isinstance(chat, list) and all(isinstance(m, dict) for m in chat):
        return chat
    return None


def canonical_exchange(record: RecordView) -> CanonicalExchange:
    """``record`` as a ``CanonicalExchange``; the reply only when the record is ``ok``.

    Raises ``InvalidInputError`` for an ``api`` with no canonicaliser.
    """
    canonicalise = CANONICALISERS.get(record.api)
    if canonicalise is None:
        raise InvalidInputError(f"record {record.id!r} has api {record.api!r}, unknown here")
    response = record.response if record.status == "ok" else None
    return canonicalise(record.request, response)
