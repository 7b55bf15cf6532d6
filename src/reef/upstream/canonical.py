"""The canonical conversation form, used for prompt hashes and session inference.

A conversation becomes a list of OpenAI-style messages reduced to what identifies
them: ``role``, ``content`` (text parts joined into one string, any other part
replaced by a stable description carrying a digest of it), ``tool_calls`` (``id``,
``name``, ``arguments`` as compact sorted-key JSON when it parses), ``tool_call_id``
and ``name``; fields that are ``None`` or empty are dropped. So an assistant reply,
as recorded from the response, equals the same reply as an SDK later re-sends it in
the next request (with its ``refusal: null``, ``annotations: []`` and other extras),
and a later request extends the earlier one message for message.

Anthropic conversations and Responses items are first translated to OpenAI form, so
all three dialects share one canonical form; ``canonical_request`` and
``canonical_reply`` pick the translation by a record's ``api``. A legacy text completion
is its prompt as one user message and its text as the assistant's reply; an embeddings
request is its input as one user message, with no reply.

The way back is ``openai_chat_messages``: canonical messages rendered as an OpenAI
chat-completions request takes them (tool calls nested under ``function``, ``content:
null`` beside them), so a stored conversation can be sent again; it reads back as the
same canonical messages. What the canonical form digested (an image, a file) it cannot
bring back: a lossless replay starts from the record's own request instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from reef.core.jsoncodec import canonical_json, loads, sha256_hex
from reef.upstream.responses.translate import items_to_messages, responses_request_to_openai
from reef.upstream.translate import anthropic_request_to_openai

_CONTENT_DIGEST_CHARS = 16


def canonical_openai(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The canonical messages of an OpenAI chat-completions request body."""
    return [canonical_message(message) for message in body.get("messages") or ()]


def canonical_anthropic(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The canonical messages of an Anthropic Messages request body (system first)."""
    return canonical_openai(anthropic_request_to_openai(body, model=""))


def canonical_responses(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The canonical messages of a Responses request body whose ``input`` holds the
    whole conversation (``instructions`` first)."""
    return canonical_openai(responses_request_to_openai(body, model=""))


def canonical_completions(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The canonical messages of a legacy text completion request: its prompt as one
    user message. Of several prompts, the first (the one ``choices[0]`` answers); a
    prompt of token ids is described by a digest, as a non-text part is."""
    return [canonical_message({"role": "user", "content": _first_input(body.get("prompt"))})]


def canonical_embeddings(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The canonical messages of an embeddings request: its inputs as one user message
    (several texts joined by newlines; token ids described by a digest)."""
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        text = "\n".join(value)
    else:
        text = _first_input(value) if not _is_token_batch(value) else _describe_tokens(value)
    return [canonical_message({"role": "user", "content": text})]


def canonical_request(api: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The canonical messages of a request of ``api`` (a record's ``api``)."""
    if api == "anthropic.messages":
        return canonical_anthropic(body)
    if api == "openai.responses":
        return canonical_responses(body)
    if api == "openai.completions":
        return canonical_completions(body)
    if api == "openai.embeddings":
        return canonical_embeddings(body)
    return canonical_openai(body)


def canonical_reply(
    api: str, response: dict[str, Any], request: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The canonical assistant message of a response of ``api`` to ``request`` (which
    only a text completion's reply depends on: ``echo``); an embeddings response has
    none: an assistant message without content."""
    if api == "anthropic.messages":
        return canonical_reply_anthropic(response)
    if api == "openai.responses":
        return canonical_reply_responses(response)
    if api == "openai.completions":
        return canonical_reply_completions(response, request)
    if api == "openai.embeddings":
        return {"role": "assistant"}
    return canonical_reply_openai(response)


def canonical_reply_completions(
    resp: dict[str, Any], request: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The canonical assistant message of a ``text_completion``: its first choice's
    text, without the prompt that ``echo`` in ``request`` put before it (the reply is
    what the model wrote)."""
    choices = resp.get("choices") or [{}]
    first = choices[0] if isinstance(choices[0], dict) else {}
    text = first.get("text")
    text = text if isinstance(text, str) else ""
    if request is not None and request.get("echo"):
        prompt = _first_input(request.get("prompt"))
        if text.startswith(prompt):
            text = text[len(prompt) :]
    return canonical_message({"role": "assistant", "content": text})


def canonical_reply_openai(resp: dict[str, Any]) -> dict[str, Any]:
    """The canonical assistant message of a chat.completion (its first choice)."""
    choices = resp.get("choices") or [{}]
    message = dict(choices[0].get("message") or {})
    message.setdefault("role", "assistant")
    return canonical_message(message)


def canonical_reply_anthropic(resp: dict[str, Any]) -> dict[str, Any]:
    """The canonical assistant message of a Messages API ``message``."""
    turn = {"role": "assistant", "content": resp.get("content") or []}
    return canonical_anthropic({"messages": [turn]})[0]


def canonical_reply_responses(resp: dict[str, Any]) -> dict[str, Any]:
    """The canonical assistant message of a Responses ``response``: its output items
    as one assistant message, equal to the same items re-sent as the next input."""
    messages = items_to_messages(list(resp.get("output") or ()))
    return canonical_message(messages[0] if messages else {"role": "assistant"})


def canonical_message(message: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI-style message in canonical form."""
    out: dict[str, Any] = {"role": message.get("role", "")}
    content = _content_text(message.get("content"))
    if content:
        out["content"] = content
    calls = [_tool_call(call) for call in message.get("tool_calls") or ()]
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if message.get(key):
            out[key] = message[key]
    return out


def openai_chat_messages(messages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` (canonical, or already OpenAI chat form) as an OpenAI chat request's
    ``messages``: each through ``openai_chat_message``.

    For every canonical conversation ``c``,
    ``canonical_openai({"messages": openai_chat_messages(c)}) == c``.
    """
    return [openai_chat_message(message) for message in messages]


def openai_chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """One message in OpenAI chat form: a canonical tool call ``{"id", "name",
    "arguments"}`` becomes ``{"id", "type": "function", "function": {"name",
    "arguments"}}``; a message without ``content`` gets ``null`` when it is an assistant
    turn with tool calls, else ``""`` (what the canonical form dropped). Anything already
    in OpenAI form (a call with ``function``, content parts, ``null`` content) is kept
    as it is, and so are the other fields (``tool_call_id``, ``name``)."""
    out = dict(message)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_openai_tool_call(call) for call in calls]
    if "content" not in out:
        out["content"] = None if calls and message.get("role") == "assistant" else ""
    return out


def chain_hashes(messages: list[dict[str, Any]]) -> list[str]:
    """The hash of every prefix: ``h_i = sha256(h_{i-1} + canonical_json(m_i))``.

    Chaining gives all prefix hashes in one pass over the messages (hashing each
    prefix afresh would be quadratic), and ``h_i`` still depends on every message up
    to ``i``. Session inference looks a request's prefix hashes up among the hashes
    of earlier conversations-plus-reply to find the conversation it continues.
    """
    hashes: list[str] = []
    previous: str | None = None
    for message in messages:
        previous = extend_chain(previous, message)
        hashes.append(previous)
    return hashes


def continuation_candidates(conversation: list[dict[str, Any]], chain: list[str]) -> list[str]:
    """Hashes of every prefix of ``conversation`` (``chain``: its ``chain_hashes``) that
    ends with an assistant reply, longest first: the continuation hashes an earlier
    exchange of the same session may have been stored under.

    Only such a prefix can be an earlier exchange plus its reply, so a first-turn request
    (no assistant message) costs no lookup at all. The gateway infers a live request's
    session with it, ``reef import`` an imported record's.
    """
    return [
        chain[index]
        for index in range(len(conversation) - 1, -1, -1)
        if conversation[index].get("role") == "assistant"
    ]


def extend_chain(previous: str | None, message: dict[str, Any]) -> str:
    """The next link of ``chain_hashes`` after ``previous`` (None for the first)."""
    return sha256_hex((previous or "").encode() + canonical_json(message))


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        return _describe(content)
    pieces: list[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            pieces.append(str(part.get("text", "")))
        elif isinstance(part, str):
            pieces.append(part)
        else:
            pieces.append(_describe(part))
    return "\n".join(pieces)


def _first_input(value: Any) -> str:
    """A prompt or input's first text: a string itself, a list's first string, token
    ids (a list of integers, or the first of a list of such lists) by a digest."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        return ""
    first = value[0]
    if isinstance(first, str):
        return first
    if isinstance(first, list):
        return _describe_tokens(first)
    return _describe_tokens(value)


def _is_token_batch(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, list) for v in value)


def _describe_tokens(tokens: Any) -> str:
    digest = sha256_hex(canonical_json(tokens))[:_CONTENT_DIGEST_CHARS]
    return f"[tokens sha256:{digest}]"


def _describe(part: Any) -> str:
    kind = part.get("type", "part") if isinstance(part, dict) else type(part).__name__
    digest = sha256_hex(canonical_json(part))[:_CONTENT_DIGEST_CHARS]
    return f"[{kind} sha256:{digest}]"


def _openai_tool_call(call: Any) -> Any:
    if not isinstance(call, dict) or isinstance(call.get("function"), dict):
        return call  # OpenAI form already (or nothing a renderer could mend)
    # Missing parts become empty strings: the canonical form drops empty ones, so they
    # read back the same, and OpenAI's form wants strings there.
    function = {"name": call.get("name") or "", "arguments": call.get("arguments") or ""}
    return {"id": call.get("id") or "", "type": "function", "function": function}


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    out: dict[str, Any] = {}
    if call.get("id"):
        out["id"] = call["id"]
    if function.get("name"):
        out["name"] = function["name"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = canonical_json(loads(arguments)).decode()
    elif arguments is not None:
        arguments = canonical_json(arguments).decode()
    if arguments:
        out["arguments"] = arguments
    return out
