"""A scripted agent loop through an official SDK (OpenAI or Anthropic), for trajectory
tests: it keeps its conversation in the dialect's own form, re-sends it as an agent
framework does, and appends each reply (streamed or not) the way the SDK returned it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.gateway.harness import GatewayThread

Dialect = Literal["openai", "anthropic"]
SCENARIOS = {"openai": "support", "anthropic": "claude"}

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER_OPENAI = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": WEATHER_SCHEMA,
    },
}
WEATHER_ANTHROPIC = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER_SCHEMA,
}


@dataclass(frozen=True)
class Call:
    """A tool call the model made: its id, function name and arguments (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Sent:
    """One exchange as the client saw it."""

    record_id: str
    session_id: str
    text: str
    calls: tuple[Call, ...]


@dataclass
class Agent:
    """An agent's conversation in ``dialect`` form against ``gateway``."""

    gateway: GatewayThread
    dialect: Dialect
    stream: bool = False
    session: str | None = None
    system: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    key: str = "none"  # the API key the SDK sends

    @property
    def scenario(self) -> str:
        return SCENARIOS[self.dialect]

    def user(self, text: str) -> Agent:
        self.history.append({"role": "user", "content": text})
        return self

    def results(self, *answers: tuple[Call, str]) -> Agent:
        """The tool results for ``answers`` (call, result text), as the dialect sends them:
        one ``tool`` message each (OpenAI), one user message of ``tool_result`` blocks
        (Anthropic)."""
        if self.dialect == "openai":
            for call, text in answers:
                self.history.append({"role": "tool", "tool_call_id": call.id, "content": text})
        else:
            blocks = [
                {"type": "tool_result", "tool_use_id": call.id, "content": text}
                for call, text in answers
            ]
            self.history.append({"role": "user", "content": blocks})
        return self

    def fork(self) -> Agent:
        """Another agent with a copy of this conversation (same session header)."""
        return Agent(
            self.gateway,
            self.dialect,
            self.stream,
            self.session,
            self.system,
            list(self.history),
            self.key,
        )

    def ask(self, tools: bool = True, keep: bool = True) -> Sent:
        """Send the conversation; append the reply unless ``keep`` is False."""
        headers = {"x-reef-scenario": self.scenario}
        if self.session is not None:
            headers["x-reef-session"] = self.session
        if self.dialect == "openai":
            sent, message = self._openai(headers, tools)
        else:
            sent, message = self._anthropic(headers, tools)
        if keep:
            self.history.append(message)
        return sent

    def _openai(self, headers: dict[str, str], tools: bool) -> tuple[Sent, dict[str, Any]]:
        client = self.gateway.openai(api_key=self.key)
        messages = list(self.history)
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        kwargs: dict[str, Any] = {"model": "gpt-4o", "messages": messages, "extra_headers": headers}
        if tools:
            kwargs["tools"] = [WEATHER_OPENAI]
        if not self.stream:
            raw = client.chat.completions.with_raw_response.create(**kwargs)
            message = raw.parse().choices[0].message.model_dump(exclude_none=True)
            return self._sent(raw.headers, message), message
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        with client.chat.completions.with_streaming_response.create(stream=True, **kwargs) as r:
            for chunk in r.parse():
                for choice in chunk.choices:
                    text.append(choice.delta.content or "")
                    for delta in choice.delta.tool_calls or ():
                        empty = {"name": "", "arguments": ""}
                        call = calls.setdefault(
                            delta.index, {"id": "", "type": "function", "function": empty}
                        )
                        call["id"] = delta.id or call["id"]
                        if delta.function is not None:
                            call["function"]["name"] += delta.function.name or ""
                            call["function"]["arguments"] += delta.function.arguments or ""
            response_headers = r.headers
        message = {"role": "assistant", "content": "".join(text) or None}
        if calls:
            message["tool_calls"] = [calls[index] for index in sorted(calls)]
        return self._sent(response_headers, message), message

    def _anthropic(self, headers: dict[str, str], tools: bool) -> tuple[Sent, dict[str, Any]]:
        client = self.gateway.anthropic(api_key=self.key)
        kwargs: dict[str, Any] = {
            "model": "claude-x",
            "max_tokens": 64,
            "messages": list(self.history),
            "extra_headers": headers,
        }
        if self.system is not None:
            kwargs["system"] = self.system
        if tools:
            kwargs["tools"] = [WEATHER_ANTHROPIC]
        if self.stream:
            with client.messages.stream(**kwargs) as events:
                final = events.get_final_message()
                response_headers = events.response.headers
        else:
            raw = client.messages.with_raw_response.create(**kwargs)
            final, response_headers = raw.parse(), raw.headers
        blocks = [block.model_dump(exclude_none=True) for block in final.content]
        message = {"role": "assistant", "content": blocks}
        return self._sent(response_headers, message), message

    def _sent(self, headers: Any, message: dict[str, Any]) -> Sent:
        return Sent(
            record_id=headers["x-reef-record-id"],
            session_id=headers["x-reef-session-id"],
            text=_text_of(message),
            calls=_calls_of(message),
        )


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if b.get("type") == "text")
    return content or ""


def _calls_of(message: dict[str, Any]) -> tuple[Call, ...]:
    if isinstance(message.get("content"), list):
        return tuple(
            Call(b["id"], b["name"], json.dumps(b["input"], separators=(",", ":")))
            for b in message["content"]
            if b.get("type") == "tool_use"
        )
    return tuple(
        Call(c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or ()
    )
