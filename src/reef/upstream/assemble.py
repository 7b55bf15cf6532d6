"""Reassemble streamed responses into the complete response objects that are recorded.

``OpenAIStreamAssembler`` turns chat.completion.chunk objects into a chat.completion;
``CompletionStreamAssembler`` turns a legacy text completion's chunks into one
``text_completion``; ``AnthropicStreamAssembler`` turns Messages stream events into a
message. Each accepts whatever arrives, in order, and ``result()`` may be called at any
point (a stream cut short still yields what was received).
"""

from __future__ import annotations

import copy
from typing import Any

from reef.upstream.translate import tool_input


class _OpenAIChoice:
    __slots__ = ("content", "finish_reason", "reasoning", "refusal", "role", "tool_calls")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.refusal: list[str] = []
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None


class OpenAIStreamAssembler:
    """Builds a ``chat.completion`` from ``chat.completion.chunk`` objects."""

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}
        self._choices: dict[int, _OpenAIChoice] = {}
        self._usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:  # noqa: C901
        """Add one parsed chunk (``data:`` payload other than ``[DONE]``)."""
        for key in ("id", "model", "created", "system_fingerprint"):
            if key not in self._meta and chunk.get(key) is not None:
                self._meta[key] = chunk[key]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            state = self._choices.get(index)
            if state is None:
                state = self._choices[index] = _OpenAIChoice()
            delta = choice.get("delta") or {}
            if delta.get("role"):
                state.role = delta["role"]
            if delta.get("content"):
                state.content.append(delta["content"])
            if delta.get("reasoning_content"):
                state.reasoning.append(delta["reasoning_content"])
            if delta.get("refusal"):
                state.refusal.append(delta["refusal"])
            for call in delta.get("tool_calls") or ():
                _add_tool_call_delta(state.tool_calls, call)
            if choice.get("finish_reason"):
                state.finish_reason = choice["finish_reason"]

    def result(self) -> dict[str, Any]:
        """The chat.completion received so far (``usage`` only when the server sent it)."""
        out: dict[str, Any] = {
            "id": self._meta.get("id", ""),
            "object": "chat.completion",
            "created": self._meta.get("created", 0),
            "model": self._meta.get("model", ""),
            "choices": [
                _choice_result(index, self._choices[index]) for index in sorted(self._choices)
            ],
        }
        if "system_fingerprint" in self._meta:
            out["system_fingerprint"] = self._meta["system_fingerprint"]
        if self._usage is not None:
            out["usage"] = self._usage
        return out


def _add_tool_call_delta(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    index = delta.get("index", len(calls))
    call = calls.get(index)
    function = delta.get("function") or {}
    if call is None:
        call = calls[index] = {"id": "", "type": "function", "name": "", "arguments": []}
    if delta.get("id"):
        call["id"] = delta["id"]
    if function.get("name"):
        call["name"] += function["name"]
    if function.get("arguments"):
        call["arguments"].append(function["arguments"])


def _choice_result(index: int, state: _OpenAIChoice) -> dict[str, Any]:
    tool_calls = [
        {
            "id": call["id"],
            "type": call["type"],
            "function": {"name": call["name"], "arguments": "".join(call["arguments"])},
        }
        for _, call in sorted(state.tool_calls.items())
    ]
    if state.content:
        content: str | None = "".join(state.content)
    else:
        content = None if tool_calls else ""
    message: dict[str, Any] = {"role": state.role, "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if state.reasoning:
        message["reasoning_content"] = "".join(state.reasoning)
    if state.refusal:
        message["refusal"] = "".join(state.refusal)
    return {
        "index": index,
        "message": message,
        "finish_reason": state.finish_reason,
        "logprobs": None,
    }


class CompletionStreamAssembler:
    """Builds a ``text_completion`` from the chunks of a streamed legacy completion
    (each a ``text_completion`` whose choices carry a piece of ``text``)."""

    def __init__(self) -> None:
        self._meta: dict[str, Any] = {}
        self._text: dict[int, list[str]] = {}
        self._finish: dict[int, str | None] = {}
        self._logprobs: dict[int, list[Any]] = {}
        self._usage: dict[str, Any] | None = None

    def feed(self, chunk: dict[str, Any]) -> None:
        """Add one parsed chunk (``data:`` payload other than ``[DONE]``)."""
        for key in ("id", "model", "created", "system_fingerprint"):
            if key not in self._meta and chunk.get(key) is not None:
                self._meta[key] = chunk[key]
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            pieces = self._text.setdefault(index, [])
            self._finish.setdefault(index, None)
            if isinstance(choice.get("text"), str):
                pieces.append(choice["text"])
            if choice.get("logprobs") is not None:
                self._logprobs.setdefault(index, []).append(choice["logprobs"])
            if choice.get("finish_reason"):
                self._finish[index] = choice["finish_reason"]

    def result(self) -> dict[str, Any]:
        """The text_completion received so far (``usage`` only when the server sent
        it; each choice's ``logprobs`` the list of its chunks' logprobs, if any)."""
        out: dict[str, Any] = {
            "id": self._meta.get("id", ""),
            "object": "text_completion",
            "created": self._meta.get("created", 0),
            "model": self._meta.get("model", ""),
            "choices": [
                {
                    "index": index,
                    "text": "".join(self._text[index]),
                    "logprobs": self._logprobs.get(index),
                    "finish_reason": self._finish.get(index),
                }
                for index in sorted(self._text)
            ],
        }
        if "system_fingerprint" in self._meta:
            out["system_fingerprint"] = self._meta["system_fingerprint"]
        if self._usage is not None:
            out["usage"] = self._usage
        return out


class AnthropicStreamAssembler:
    """Builds a Messages API ``message`` from stream events.

    A tool_use block's ``input`` is parsed from its concatenated ``partial_json``
    (text that is not a JSON object is kept as ``{"_raw_arguments": text}``, as in
    ``reef.upstream.translate``). ``usage`` merges ``message_start`` and
    ``message_delta``; an ``error`` event is kept in ``.error``. Text and thinking
    deltas are kept as pieces and joined by ``result()``: adding each to a growing
    string would make a long answer quadratic (100 MB in 64 KiB deltas: ~80 GB copied).
    """

    def __init__(self) -> None:
        self._message: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._partial_json: dict[int, list[str]] = {}
        self._pieces: dict[tuple[int, str], list[str]] = {}  # (index, "text"|"thinking")
        self.error: dict[str, Any] | None = None

    def feed(self, event: str, data: dict[str, Any]) -> None:
        """Add one event (its SSE ``event`` name and parsed ``data``)."""
        if event == "content_block_delta":
            self._delta(data.get("index", 0), data.get("delta") or {})
        elif event == "content_block_start":
            index = data.get("index", 0)
            self._blocks[index] = copy.deepcopy(data.get("content_block") or {})
            self._pieces.pop((index, "text"), None)
            self._pieces.pop((index, "thinking"), None)
            if self._blocks[index].get("type") in ("tool_use", "server_tool_use"):
                self._partial_json[index] = []
        elif event == "message_start":
            self._message = copy.deepcopy(data.get("message") or {})
        elif event == "message_delta":
            for key, value in (data.get("delta") or {}).items():
                self._message[key] = value
            usage = self._message.setdefault("usage", {})
            for key, value in (data.get("usage") or {}).items():
                if value is not None:
                    usage[key] = value
        elif event == "error":
            self.error = data.get("error") or data

    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            self._pieces.setdefault((index, "text"), []).append(delta.get("text", ""))
        elif kind == "input_json_delta":
            self._partial_json.setdefault(index, []).append(delta.get("partial_json", ""))
        elif kind == "thinking_delta":
            self._pieces.setdefault((index, "thinking"), []).append(delta.get("thinking", ""))
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature", "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def result(self) -> dict[str, Any]:
        """The message received so far."""
        message = dict(self._message)
        message.setdefault("type", "message")
        message.setdefault("role", "assistant")
        content: list[dict[str, Any]] = []
        for index in sorted(self._blocks):
            block = dict(self._blocks[index])
            pieces = self._partial_json.get(index)
            if pieces:
                block["input"] = tool_input("".join(pieces))
            for key in ("text", "thinking"):
                if (index, key) in self._pieces:
                    block[key] = block.get(key, "") + "".join(self._pieces[index, key])
            content.append(block)
        message["content"] = content
        message.setdefault("stop_reason", None)
        message.setdefault("stop_sequence", None)
        return message
