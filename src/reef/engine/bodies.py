"""OpenAI-shaped bodies: completions, stream chunks, logprobs, errors, model cards."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reef.core.chat_format import ToolCall, ToolCallStream, parse_tool_calls
from reef.engine.sequences import ChoiceDelta, FinishReason, TokenLogprob

TokenText = Callable[[int], str]

ADAPTER_DIGEST_HEADER = "x-reef-adapter-digest"
"""Response header naming the digest of the adapter version that generated the answer."""


def completion_id() -> str:
    """An id in OpenAI's ``chatcmpl-…`` form."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """``{"error": {...}}`` as the OpenAI API sends it."""
    kind = {
        400: "invalid_request_error",
        404: "invalid_request_error",
        413: "invalid_request_error",
        405: "invalid_request_error",
        501: "not_implemented_error",
        503: "service_unavailable",
    }.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def logprobs_content(entries: tuple[TokenLogprob, ...], text: TokenText) -> list[dict[str, Any]]:
    """``choice.logprobs.content`` items for ``entries``."""

    def item(token_id: int, logprob: float) -> dict[str, Any]:
        token = text(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
        for e in entries
    ]


@dataclass
class ChoiceAccumulator:
    """Collects one choice's deltas for a non-streaming response."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def add(self, delta: ChoiceDelta) -> None:
        """Append a delta of this choice."""
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        self.finish_reason = delta.finish_reason or self.finish_reason


@dataclass(frozen=True)
class ToolParsing:
    """How replies are read for tool calls: the offered function ``names`` (a call to
    any other is text) and the ``prefill`` the prompt already ends with, which is the
    start of every reply."""

    names: frozenset[str]
    prefill: str = ""
    parallel: bool = True

    def stream(self) -> ToolCallStream:
        """A parser for one streamed choice, already fed the prefill."""
        parser = ToolCallStream(self.names, parallel=self.parallel)
        parser.feed(self.prefill)  # text before a forced call is empty: nothing comes out
        return parser


@dataclass(frozen=True)
class ResponseShape:
    """What a request asked to see beyond text: logprobs, token ids, tool calls (None:
    replies are plain text); and its names."""

    id: str
    model: str
    created: int
    logprobs: bool
    token_ids: bool
    text: TokenText
    tools: ToolParsing | None = None

    @classmethod
    def new(
        cls,
        model: str,
        logprobs: bool,
        token_ids: bool,
        text: TokenText,
        tools: ToolParsing | None = None,
    ) -> ResponseShape:
        """A shape with a fresh id and creation time."""
        return cls(completion_id(), model, int(time.time()), logprobs, token_ids, text, tools)

    def completion(self, choices: list[ChoiceAccumulator], prompt_ids: list[int]) -> dict[str, Any]:
        """The full ``chat.completion`` body."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [self._choice(i, c) for i, c in enumerate(choices)],
            "usage": usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
        }
        if self.token_ids:
            body["prompt_token_ids"] = prompt_ids
        return body

    def _choice(self, index: int, choice: ChoiceAccumulator) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(choice.text)}
        finish_reason: str | None = choice.finish_reason
        if self.tools is not None:
            tools = self.tools
            reply = parse_tool_calls(
                tools.prefill + message["content"], tools.names, parallel=tools.parallel
            )
            message["content"] = reply.content
            if reply.calls:
                message["content"] = reply.content or None
                message["tool_calls"] = [call.to_openai() for call in reply.calls]
                finish_reason = "tool_calls"
        body: dict[str, Any] = {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(tuple(choice.logprobs)),
            "finish_reason": finish_reason,
        }
        if self.token_ids:
            body["token_ids"] = choice.token_ids
        return body

    def _logprobs(self, entries: tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
        return {"content": logprobs_content(entries, self.text)} if self.logprobs else None

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        """One ``chat.completion.chunk``."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def role_chunk(self, n: int, prompt_ids: list[int]) -> dict[str, Any]:
        """The opening chunk: the assistant role for every choice."""
        choices: list[dict[str, Any]] = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
                **({"token_ids": []} if self.token_ids else {}),
            }
            for i in range(n)
        ]
        extra = {"prompt_token_ids": prompt_ids} if self.token_ids else {}
        return self.chunk(choices, **extra)

    def delta_chunk(self, delta: ChoiceDelta) -> dict[str, Any]:
        """A chunk carrying one choice's new text (and tokens, logprobs, finish)."""
        choice = self._delta_choice(delta, {"content": delta.text} if delta.text else {})
        choice["finish_reason"] = delta.finish_reason
        return self.chunk([choice])

    def tool_chunks(self, delta: ChoiceDelta, parser: ToolCallStream) -> list[dict[str, Any]]:
        """The chunks for one choice's delta when replies are read for tool calls:
        text as ``content``; each call once recognised, in OpenAI's streaming shape
        (``index``, ``id``, ``type`` and the function name, then its ``arguments``);
        ``finish_reason`` ``tool_calls`` on the last chunk when the choice made one,
        which without parallel calls is the chunk of its first call."""
        if parser.done:
            return []  # the choice has finished with its call (parallel calls off)
        pieces = parser.feed(delta.text)
        if delta.finish_reason:
            pieces += parser.finish()
        text = "".join(p for p in pieces if isinstance(p, str))
        calls = [p for p in pieces if isinstance(p, ToolCall)]
        first_index = len(parser.calls) - len(calls)
        finish = delta.finish_reason and ("tool_calls" if parser.calls else delta.finish_reason)
        if parser.done:
            finish = "tool_calls"
        if not (text or calls or finish or self.logprobs or self.token_ids):
            return []
        opening: dict[str, Any] = {"content": text} if text else {}
        if calls:
            opening["tool_calls"] = [
                {
                    "index": first_index + i,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }
                for i, call in enumerate(calls)
            ]
        chunks = [self._delta_choice(delta, opening)]
        chunks += [
            {
                "index": delta.index,
                "delta": {
                    "tool_calls": [
                        {"index": first_index + i, "function": {"arguments": call.arguments}}
                    ]
                },
                "logprobs": None,
                "finish_reason": None,
            }
            for i, call in enumerate(calls)
        ]
        chunks[-1]["finish_reason"] = finish or None
        return [self.chunk([choice]) for choice in chunks]

    def _delta_choice(self, delta: ChoiceDelta, body: dict[str, Any]) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": delta.index,
            "delta": body,
            "logprobs": self._logprobs(delta.logprobs),
            "finish_reason": None,
        }
        if self.token_ids:
            choice["token_ids"] = list(delta.token_ids)
        return choice

    def wants(self, delta: ChoiceDelta) -> bool:
        """Whether a delta needs a chunk of its own (empty text matters only when the
        client counts tokens)."""
        return bool(delta.text or delta.finish_reason or self.logprobs or self.token_ids)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI ``usage``; completion tokens include the end-of-turn token when sampled."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
