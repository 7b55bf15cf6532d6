"""Responses ⇄ chat translation: requests, responses, streams and the canonical form."""

from __future__ import annotations

from typing import Any

import pytest

from reef.upstream import (
    OpenAIToResponsesStream,
    UpstreamTruncatedError,
    canonical_reply_responses,
    canonical_responses,
    chain_hashes,
    extend_chain,
    openai_response_to_responses,
    response_events,
    response_shell,
    responses_request_to_openai,
)


def _shell(**body: Any) -> dict[str, Any]:
    return response_shell({"input": "x", **body}, "resp_1", "reef/support", 0)


def _completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
    }


def test_items_become_chat_messages() -> None:
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Prefer metric units."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Look:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Calling."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
        ],
        "max_output_tokens": 9,
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_object"}},
        "reasoning": {"effort": "low"},
        "metadata": {"kept": "here"},
    }
    chat = responses_request_to_openai(body, "m")
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Prefer metric units."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    assert chat["max_tokens"] == 9 and chat["reasoning_effort"] == "low"
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert chat["response_format"] == {"type": "json_object"}
    assert "metadata" not in chat and "stream" not in chat


def test_a_completion_becomes_a_response() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    response = openai_response_to_responses(
        _completion({"role": "assistant", "content": "Sure.", "tool_calls": [call]}, "tool_calls"),
        _shell(),
    )
    assert response["status"] == "completed" and response["incomplete_details"] is None
    message, function_call = response["output"]
    assert message["content"][0]["text"] == "Sure." and message["role"] == "assistant"
    assert function_call["call_id"] == "call_1" and function_call["arguments"] == "{}"
    assert response["usage"]["input_tokens"] == 4 and response["usage"]["total_tokens"] == 6
    cut = openai_response_to_responses(_completion({"content": "Half"}, "length"), _shell())
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert cut["output"][0]["status"] == "incomplete"


def test_a_reply_hashes_like_the_same_items_sent_back() -> None:
    """A response's reply, re-sent as the next input, extends the conversation's chain:
    what session inference relies on."""
    body = {"instructions": "Be brief.", "input": "weather?"}
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    response = openai_response_to_responses(
        _completion({"content": "Checking.", "tool_calls": [call]}, "tool_calls"), _shell()
    )
    conversation = canonical_responses(body)
    continuation = extend_chain(chain_hashes(conversation)[-1], canonical_reply_responses(response))
    sent_back = [
        {"role": "user", "content": "weather?"},
        *response["output"],
        {"type": "function_call_output", "call_id": "call_1", "output": "sun"},
    ]
    later = canonical_responses({"instructions": "Be brief.", "input": sent_back})
    assert chain_hashes(later)[2] == continuation


def _stream(chunks: list[dict[str, Any]]) -> tuple[list[tuple[str, dict[str, Any]]], Any]:
    translator = OpenAIToResponsesStream(_shell())
    events = [event for chunk in chunks for event in translator.feed(chunk)]
    return events, translator


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_stream_cut_short_is_truncated_and_a_failure_is_response_failed() -> None:
    events, translator = _stream([_chunk({"content": "Hel"})])
    assert [kind for kind, _ in events][:2] == ["response.created", "response.in_progress"]
    with pytest.raises(UpstreamTruncatedError):
        translator.finish()
    kind, failed = translator.failed("upstream_error: boom")[-1]
    assert kind == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == "upstream_error: boom"
    assert failed["response"]["output"][0]["content"][0]["text"] == "Hel"
    assert translator.result() == failed["response"]


def test_a_stream_at_the_token_limit_ends_incomplete() -> None:
    _, translator = _stream([_chunk({"content": "Hel"}), _chunk({}, "length")])
    kind, last = translator.finish()[-1]
    assert kind == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_finished_response_replays_as_its_events() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": "Look "}),
        _chunk({"content": "up."}),
        _chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f"}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}, "tool_calls"),
    ]
    live, translator = _stream(chunks)
    live += translator.finish()
    replayed = response_events(translator.result())
    assert replayed[-1][0] == live[-1][0] == "response.completed"
    assert replayed[-1][1]["response"] == live[-1][1]["response"]
    done = [payload["item"] for kind, payload in replayed if kind == "response.output_item.done"]
    assert done == translator.result()["output"]
    assert [payload["sequence_number"] for _, payload in replayed] == list(range(len(replayed)))
