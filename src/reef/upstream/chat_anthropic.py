"""OpenAI Chat Completions → Anthropic Messages, and Anthropic's answers back as
chat.completion objects and chunks, so a request the gateway holds in the chat form (a
Responses request's translation) can be served by the Anthropic API.

Requests: system and developer messages become ``system`` (joined, in order); a user
message's text and images become blocks; an assistant message's tool calls become
``tool_use`` blocks (arguments parsed: ``reef.upstream.translate.tool_input``); ``tool``
messages become ``tool_result`` blocks of the user turn after them; consecutive
messages of one role are merged into one turn, as the Messages API wants alternating
turns. ``max_tokens`` is required there: without one in the request,
``DEFAULT_MAX_TOKENS`` is sent. Answers: text blocks join into the message's content,
``tool_use`` blocks become tool calls, the stop reason a ``finish_reason`` (a
``refusal`` is ``content_filter``). Thinking blocks have no chat counterpart and are not
asked for (no request sets ``thinking``); should one arrive it is left out.

The request is assumed checked for what has no Anthropic counterpart
(``reef.gateway.responses.checks.check_responses_for_anthropic``): ``response_format``
and ``reasoning_effort`` are refused there with a 400, never dropped here.
"""

from __future__ import annotations

from typing import Any, Final

from reef.upstream.translate import arguments_text, tool_input

DEFAULT_MAX_TOKENS: Final = 4096
_FINISH_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
_TOOL_CHOICES: Final = {"auto": "auto", "required": "any", "none": "none"}

Chunk = dict[str, Any]


# -- requests: chat → Anthropic ----------------------------------------------------------


def openai_request_to_anthropic(chat: dict[str, Any], model: str) -> dict[str, Any]:
    """An Anthropic Messages request equivalent to a (checked) chat-completions
    request; ``model`` is the upstream model name."""
    system, turns = _turns(chat.get("messages") or [])
    max_tokens = chat.get("max_tokens") or chat.get("max_completion_tokens")
    out: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens or DEFAULT_MAX_TOKENS,
        "messages": turns,
    }
    if any(system):
        out["system"] = "\n\n".join(text for text in system if text)
    for source, target in (("temperature", "temperature"), ("top_p", "top_p")):
        if chat.get(source) is not None:
            out[target] = chat[source]
    stop = chat.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if chat.get("user"):
        out["metadata"] = {"user_id": chat["user"]}
    _tools(chat, out)
    if chat.get("stream"):
        out["stream"] = True
    return out


def _turns(messages: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The system texts and the alternating user/assistant turns of chat messages."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text(message.get("content")))
            continue
        blocks = _blocks(message)
        if not blocks:
            continue  # an empty assistant turn says nothing, and Anthropic refuses one
        turn_role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == turn_role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": turn_role, "content": blocks})
    return system, turns


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        result = {
            "type": "tool_result",
            "tool_use_id": message.get("tool_call_id", ""),
            "content": _text(content),
        }
        return [result]
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    else:
        for part in content or ():
            if part.get("type") == "text" and part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
            elif part.get("type") == "image_url":
                blocks.append(_image((part.get("image_url") or {}).get("url", "")))
    for call in message.get("tool_calls") or () if role == "assistant" else ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id", ""),
                "name": function.get("name", ""),
                "input": tool_input(function.get("arguments")),
            }
        )
    return blocks


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[len("data:") :].split(";base64,", 1)
        source = {"type": "base64", "media_type": media_type, "data": data}
        return {"type": "image", "source": source}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(
        str(part.get("text", "")) for part in content or () if part.get("type") == "text"
    )


def _tools(chat: dict[str, Any], out: dict[str, Any]) -> None:
    tools = []
    for tool in chat.get("tools") or ():
        function = tool.get("function") or {}
        converted: dict[str, Any] = {
            "name": function.get("name", ""),
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            converted["description"] = function["description"]
        tools.append(converted)
    if not tools:
        return
    out["tools"] = tools
    choice = chat.get("tool_choice")
    anthropic_choice: dict[str, Any] | None = None
    if isinstance(choice, str) and choice in _TOOL_CHOICES:
        anthropic_choice = {"type": _TOOL_CHOICES[choice]}
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name", "")
        anthropic_choice = {"type": "tool", "name": name}
    if chat.get("parallel_tool_calls") is False:
        anthropic_choice = {**(anthropic_choice or {"type": "auto"})}
        if anthropic_choice["type"] != "none":
            anthropic_choice["disable_parallel_tool_use"] = True
    if anthropic_choice is not None:
        out["tool_choice"] = anthropic_choice


# -- answers: Anthropic → chat -----------------------------------------------------------


def finish_reason(stop_reason: Any) -> str | None:
    """The chat ``finish_reason`` for an Anthropic ``stop_reason`` (``None`` for none)."""
    if stop_reason is None:
        return None
    return _FINISH_REASONS.get(str(stop_reason), "stop")


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Anthropic usage as chat usage: prompt tokens count the cached ones too, as
    OpenAI's do (Anthropic's ``input_tokens`` leaves them out)."""
    if not usage:
        return None
    cached = usage.get("cache_read_input_tokens") or 0
    prompt = (usage.get("input_tokens") or 0) + cached
    prompt += usage.get("cache_creation_input_tokens") or 0
    completion = usage.get("output_tokens") or 0
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def anthropic_response_to_openai(message: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion equivalent to an Anthropic ``message``."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        if block.get("type") == "text":
            texts.append(block.get("text", ""))
        elif block.get("type") == "tool_use":
            calls.append(
                {
                    "id": block.get("id", ""),
                    "type": "function",
                    "function": {
                        "name": block.get("name", ""),
                        "arguments": arguments_text(block.get("input")),
                    },
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        reply["tool_calls"] = calls
    elif reply["content"] is None:
        reply["content"] = ""
    choice = {
        "index": 0,
        "message": reply,
        "finish_reason": finish_reason(message.get("stop_reason")),
    }
    completion: dict[str, Any] = {
        "id": message.get("id", ""),
        "object": "chat.completion",
        "model": message.get("model", ""),
        "choices": [choice],
    }
    usage = chat_usage(message.get("usage"))
    if usage is not None:
        completion["usage"] = usage
    return completion


class AnthropicToOpenAIStream:
    """Turns Anthropic stream events into chat.completion.chunk objects, one event at a
    time: text deltas become content deltas, each ``tool_use`` block a tool call (its
    ``input_json_delta`` pieces its arguments), ``message_delta`` the finish reason and
    the usage. ``ping`` and thinking blocks give nothing."""

    def __init__(self) -> None:
        self.id = ""
        self.model = ""
        self.stopped = False  # message_stop arrived
        self.finish_reason: str | None = None
        self._tools: dict[int, int] = {}  # block index → tool-call index
        self._usage: dict[str, Any] = {}

    def feed(self, name: str, event: dict[str, Any]) -> list[Chunk]:
        """The chunks for one event (``name``: its type)."""
        if name == "message_start":
            message = event.get("message") or {}
            self.id = str(message.get("id") or "")
            self.model = str(message.get("model") or "")
            self._usage.update(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if name == "content_block_start":
            return self._block_start(event)
        if name == "content_block_delta":
            return self._block_delta(event)
        if name == "message_delta":
            self._usage.update(event.get("usage") or {})
            self.finish_reason = finish_reason((event.get("delta") or {}).get("stop_reason"))
            if self.finish_reason is None:
                return []
            return [
                self._chunk({}, self.finish_reason),
                {**self._chunk({}), "choices": [], "usage": chat_usage(self._usage)},
            ]
        if name == "message_stop":
            self.stopped = True
        return []

    def _block_start(self, event: dict[str, Any]) -> list[Chunk]:
        block = event.get("content_block") or {}
        if block.get("type") == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        if block.get("type") != "tool_use":
            return []
        position = len(self._tools)
        self._tools[int(event.get("index", 0))] = position
        call = {
            "index": position,
            "id": block.get("id", ""),
            "type": "function",
            "function": {"name": block.get("name", ""), "arguments": ""},
        }
        chunks = [self._chunk({"tool_calls": [call]})]
        if block.get("input"):  # sent whole at its start: no deltas will follow
            chunks.append(self._arguments(position, arguments_text(block["input"])))
        return chunks

    def _block_delta(self, event: dict[str, Any]) -> list[Chunk]:
        delta = event.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta" and delta.get("text"):
            return [self._chunk({"content": delta["text"]})]
        position = self._tools.get(int(event.get("index", 0)))
        if kind == "input_json_delta" and position is not None and delta.get("partial_json"):
            return [self._arguments(position, delta["partial_json"])]
        return []

    def _arguments(self, position: int, text: str) -> Chunk:
        return self._chunk({"tool_calls": [{"index": position, "function": {"arguments": text}}]})

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> Chunk:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
