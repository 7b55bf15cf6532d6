"""``tensorzero``: rows of TensorZero's ClickHouse tables as JSON Lines (``SELECT ...
FORMAT JSONEachRow``): ``ChatInference`` / ``JsonInference`` rows become records,
``BooleanMetricFeedback`` / ``FloatMetricFeedback`` / ``CommentFeedback`` rows feedback
and ``DemonstrationFeedback`` rows corrections. Field mapping: docs/import-export.md."""

from __future__ import annotations

import json
from typing import Any

from reef.experience.importing.base import (
    ImportedFeedback,
    ImportedRecord,
    ImportItem,
    ImportLineError,
    ImportReader,
    as_object,
    as_score,
    assistant_response,
    parse_time,
    text_of,
)


class TensorZeroReader(ImportReader):
    """One inference, metric feedback, comment or demonstration row a line."""

    name = "tensorzero"

    def sniff(self, line: Any) -> bool:
        if not isinstance(line, dict):
            return False
        inference = "function_name" in line and "episode_id" in line
        metric = "metric_name" in line and "target_id" in line
        demonstration = "inference_id" in line and "value" in line and "role" not in line
        return inference or metric or demonstration

    def read(self, line: Any) -> ImportItem:
        row = as_object(line, "a tensorzero row")
        if "function_name" in row:
            return ImportItem((_inference(row),))
        source_id = row.get("id")
        if not isinstance(source_id, str) or not source_id:
            raise ImportLineError("a feedback row needs its id")
        if "inference_id" in row:  # DemonstrationFeedback
            return ImportItem(
                (),
                (
                    ImportedFeedback(
                        source_id=source_id,
                        score=None,
                        record_sources=(str(row["inference_id"]),),
                        correction=_demonstration(row.get("value")),
                        metadata={"demonstration": True},
                    ),
                ),
            )
        target = row.get("target_id")
        if not isinstance(target, str) or not target:
            raise ImportLineError(f"feedback {source_id} needs its target_id")
        metric = row.get("metric_name")
        comment = "metric_name" not in row
        value = row.get("value")
        return ImportItem(
            (),
            (
                ImportedFeedback(
                    source_id=source_id,
                    score=None if comment else as_score(value, f"metric {metric} value"),
                    record_sources=(target,),
                    # an episode-level metric names the episode: the session's outcome
                    session_id=target,
                    feedback=value if comment else None,
                    metadata={} if comment else {"metric": metric},
                ),
            ),
        )


def _parsed(value: Any, what: str) -> Any:
    """A column ClickHouse keeps as JSON text, parsed."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as error:
            raise ImportLineError(f"{what} is not JSON: {error}") from error
    return value


def _inference(row: dict[str, Any]) -> ImportedRecord:
    source_id = row.get("id")
    if not isinstance(source_id, str) or not source_id:
        raise ImportLineError("an inference needs its id")
    given = as_object(_parsed(row.get("input"), "input"), "input")
    messages: list[dict[str, Any]] = []
    system = given.get("system")
    if system is not None:
        messages.append({"role": "system", "content": text_of(system)})
    for turn in given.get("messages") or []:
        turn = as_object(turn, "an input message")
        messages.extend(_turn(turn.get("role"), turn.get("content")))
    if len(messages) == (system is not None):
        raise ImportLineError(f"inference {source_id}: input.messages is empty")
    model = str(row.get("variant_name") or row.get("function_name"))
    request: dict[str, Any] = {"model": model, "messages": messages}
    tools = _tools(_parsed(row.get("tool_params"), "tool_params"))
    for tool in row.get("dynamic_tools") or []:  # newer rows: one JSON string a tool
        tools += _tools({"tools_available": [_parsed(tool, "dynamic_tools")]})
    if tools:
        request["tools"] = tools
    output = _parsed(row.get("output"), "output")
    if isinstance(output, dict):  # JsonInference: {"raw": ..., "parsed": ...}
        answer: dict[str, Any] = {"role": "assistant", "content": text_of(output.get("raw"))}
    elif isinstance(output, list):
        (answer,) = _turn("assistant", output) or [{"role": "assistant", "content": ""}]
    else:
        raise ImportLineError(f"inference {source_id}: output must be content blocks")
    created = parse_time(row.get("timestamp"))
    tags = {"tensorzero.function": str(row.get("function_name"))}
    if row.get("variant_name"):
        tags["tensorzero.variant"] = str(row["variant_name"])
    return ImportedRecord(
        source_id=source_id,
        request=request,
        response=assistant_response(source_id, model, answer, created),
        session_key=str(row["episode_id"]) if row.get("episode_id") else None,
        created_at=created,
        latency_ms=float(row.get("processing_time_ms") or 0.0),
        tags=tags,
    )


def _turn(role: Any, content: Any) -> list[dict[str, Any]]:
    """Chat messages for one TensorZero message: text and tool calls in one message,
    each tool result a ``tool`` message of its own."""
    if role not in ("user", "assistant"):
        raise ImportLineError(f"unknown message role {role!r}")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    return _blocks(role, content)


def _blocks(role: str, content: Any) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise ImportLineError("message content must be text or content blocks")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        block = as_object(block, "a content block")
        kind = block.get("type")
        if kind in ("text", "raw_text"):
            texts.append(text_of(block.get("text", block.get("value"))) or "")
        elif kind == "tool_call":
            calls.append(_call(block))
        elif kind == "tool_result":
            results.append(
                {"role": "tool", "tool_call_id": block.get("id"), "content": block.get("result")}
            )
        elif kind != "thought":  # reasoning is not part of the answer
            raise ImportLineError(f"content block type {kind!r} cannot be imported")
    out = list(results)
    if texts or calls:
        message: dict[str, Any] = {"role": role, "content": "\n".join(texts) if texts else None}
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def _call(block: dict[str, Any]) -> dict[str, Any]:
    """A tool call block (output: ``raw_name`` / ``raw_arguments``) in OpenAI form."""
    arguments = block.get("raw_arguments", block.get("arguments"))
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {
            "name": block.get("raw_name") or block.get("name"),
            "arguments": text_of(arguments) or "{}",
        },
    }


def _tools(params: Any) -> list[dict[str, Any]]:
    if not isinstance(params, dict):
        return []
    return [
        {
            "type": "function",
            "function": {
                "name": tool.get("name"),
                "description": tool.get("description"),
                "parameters": tool.get("parameters"),
            },
        }
        for tool in params.get("tools_available") or []
        if isinstance(tool, dict)
    ]


def _demonstration(value: Any) -> Any:
    """The demonstrated answer: text, or an assistant message with its tool calls."""
    blocks = _parsed(value, "demonstration value")
    if isinstance(blocks, dict):  # a JSON function's demonstration: the object itself
        return json.dumps(blocks, sort_keys=True)
    messages = _turn("assistant", blocks)
    if len(messages) != 1:
        raise ImportLineError("a demonstration must hold text or tool calls")
    (message,) = messages
    if "tool_calls" in message:
        return message
    return message["content"]
