"""The official SDK clients of ``bench/faults.py``: one request, plain or streaming, and
what the client saw (status, error in its dialect, a stream's error event, the answer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anthropic
import openai

# The gateway's Anthropic error types, back to the status each stands for.
_ANTHROPIC_STATUS = {"api_error": 502, "overloaded_error": 503, "timeout_error": 504}
_MB = 1024 * 1024


@dataclass
class Seen:
    """What the client saw."""

    status: int | None = None  # None: no HTTP answer at all
    kind: str = ""  # the dialect's error type
    event: int | None = None  # a stream's error event: the status it stands for
    message: str = ""
    answer: str | None = None
    receipt: str | None = None
    shaped: bool = True  # the error is in the client's dialect's shape
    seconds: float = 0.0

    def text(self) -> str:
        if self.status is None:
            return f"no answer ({self.message[:60]})"
        if self.event is not None:
            return f"{self.status} + error event {self.event} `{self.kind}`"
        if self.answer is not None:
            size = len(self.answer)
            what = f"{size / _MB:.1f} MB answer" if size > _MB else "answer"
            return f"{self.status}, {what} after {self.seconds:.1f} s"
        return f"{self.status} `{self.kind}`"


def ask(
    client: openai.OpenAI | anthropic.Anthropic, scenario: str, text: str, stream: bool
) -> Seen:
    """Send ``text`` to ``scenario`` through ``client``; what it saw (no timing)."""
    if isinstance(client, openai.OpenAI):
        return _openai_stream(client, scenario, text) if stream else _openai(client, scenario, text)
    if stream:
        return _anthropic_stream(client, scenario, text)
    return _anthropic(client, scenario, text)


def _scenario_headers(scenario: str) -> dict[str, str]:
    return {"x-reef-scenario": scenario}


def _openai_error(exc: openai.APIStatusError) -> Seen:
    body: Any = exc.body
    shaped = isinstance(body, dict) and isinstance(body.get("message"), str) and "type" in body
    return Seen(
        status=exc.status_code,
        kind=str(body.get("type")) if isinstance(body, dict) else "",
        message=exc.message,
        receipt=exc.response.headers.get("x-reef-record-id"),
        shaped=shaped,
    )


def _anthropic_error(exc: anthropic.APIStatusError) -> Seen:
    body: Any = exc.body
    error = body.get("error") if isinstance(body, dict) else None
    shaped = isinstance(body, dict) and body.get("type") == "error" and isinstance(error, dict)
    return Seen(
        status=exc.status_code,
        kind=str(error.get("type")) if isinstance(error, dict) else "",
        message=str(error.get("message", "")) if isinstance(error, dict) else str(body),
        receipt=exc.response.headers.get("x-reef-record-id"),
        shaped=shaped,
    )


def _openai(client: openai.OpenAI, scenario: str, text: str) -> Seen:
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=f"reef/{scenario}",
            messages=[{"role": "user", "content": text}],
            extra_headers=_scenario_headers(scenario),
        )
    except openai.APIStatusError as exc:
        return _openai_error(exc)
    except openai.APIConnectionError as exc:
        return Seen(message=str(exc))
    completion = raw.parse()
    return Seen(
        status=raw.status_code,
        answer=completion.choices[0].message.content,
        receipt=raw.headers.get("x-reef-record-id"),
    )


def _openai_stream(client: openai.OpenAI, scenario: str, text: str) -> Seen:
    pieces: list[str] = []
    try:
        with client.chat.completions.with_streaming_response.create(
            model=f"reef/{scenario}",
            messages=[{"role": "user", "content": text}],
            stream=True,
            extra_headers=_scenario_headers(scenario),
        ) as response:
            seen = Seen(
                status=response.status_code, receipt=response.headers.get("x-reef-record-id")
            )
            try:
                for chunk in response.parse():
                    for choice in chunk.choices:
                        pieces.append(choice.delta.content or "")
            except openai.APIStatusError:
                raise
            except openai.APIError as exc:  # the stream's error event
                body: Any = exc.body
                seen.event = body.get("code") if isinstance(body, dict) else None
                seen.kind = str(body.get("type")) if isinstance(body, dict) else ""
                seen.message = exc.message
                return seen
    except openai.APIStatusError as exc:
        return _openai_error(exc)
    except openai.APIConnectionError as exc:
        return Seen(message=str(exc))
    seen.answer = "".join(pieces)
    return seen


def _anthropic(client: anthropic.Anthropic, scenario: str, text: str) -> Seen:
    try:
        raw = client.messages.with_raw_response.create(
            model="claude-anything",
            max_tokens=64,
            messages=[{"role": "user", "content": text}],
            extra_headers=_scenario_headers(scenario),
        )
    except anthropic.APIStatusError as exc:
        return _anthropic_error(exc)
    except anthropic.APIConnectionError as exc:
        return Seen(message=str(exc))
    message = raw.parse()
    answer = "".join(block.text for block in message.content if block.type == "text")
    return Seen(status=raw.status_code, answer=answer, receipt=raw.headers.get("x-reef-record-id"))


def _anthropic_stream(client: anthropic.Anthropic, scenario: str, text: str) -> Seen:
    pieces: list[str] = []
    stopped = False
    try:
        with client.messages.with_streaming_response.create(
            model="claude-anything",
            max_tokens=64,
            messages=[{"role": "user", "content": text}],
            stream=True,
            extra_headers=_scenario_headers(scenario),
        ) as response:
            seen = Seen(
                status=response.status_code, receipt=response.headers.get("x-reef-record-id")
            )
            try:
                for event in response.parse():
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        pieces.append(event.delta.text)
                    stopped = stopped or event.type == "message_stop"
            except anthropic.APIStatusError as exc:  # the stream's error event
                error = _anthropic_error(exc)
                seen.kind, seen.message, seen.shaped = error.kind, error.message, error.shaped
                seen.event = _ANTHROPIC_STATUS.get(error.kind, 0)
                if stopped:
                    seen.message = "message_stop before the error event"
                return seen
    except anthropic.APIStatusError as exc:
        return _anthropic_error(exc)
    except anthropic.APIConnectionError as exc:
        return Seen(message=str(exc))
    seen.answer = "".join(pieces) if stopped else None
    if not stopped:
        seen.message = "the stream ended without message_stop"
    return seen
