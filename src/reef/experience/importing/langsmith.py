"""``langsmith``: LangSmith runs (``Client.list_runs`` / ``GET /api/v1/runs``, one run a
line) and feedback rows (``Client.list_feedback``, the feedback data format) as JSON
Lines. LLM runs become records; feedback rows name their run. Field mapping:
docs/import-export.md."""

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
    latency_ms,
    parse_time,
    text_of,
)

# Where LangSmith threads keep the conversation id (run metadata), in order.
THREAD_KEYS = ("session_id", "thread_id", "conversation_id")
# LangChain message types (serialized ``type`` or constructor class) -> chat roles.
_ROLES = {
    "human": "user",
    "HumanMessage": "user",
    "ai": "assistant",
    "AIMessage": "assistant",
    "AIMessageChunk": "assistant",
    "system": "system",
    "SystemMessage": "system",
    "tool": "tool",
    "ToolMessage": "tool",
}
_CORRECTION_TEXT = ("output", "content", "answer", "text")


class LangSmithReader(ImportReader):
    """One run or one feedback row a line."""

    name = "langsmith"

    def sniff(self, line: Any) -> bool:
        if not isinstance(line, dict):
            return False
        run = "run_type" in line and "inputs" in line
        return run or ("run_id" in line and "key" in line)

    def read(self, line: Any) -> ImportItem:
        row = as_object(line, "a langsmith line")
        if "run_type" not in row and "key" in row:
            return ImportItem((), (_feedback(row),))
        return ImportItem((_run(row),))


def _run(run: dict[str, Any]) -> ImportedRecord:
    source_id = run.get("id")
    if not isinstance(source_id, str) or not source_id:
        raise ImportLineError("a run needs its id")
    if run.get("run_type") != "llm":
        raise ImportLineError(
            f"run {source_id} is a {run.get('run_type')} run, not an llm run: nothing to learn from"
        )
    inputs = as_object(run.get("inputs"), "inputs")
    extra = _object(run.get("extra"))
    metadata = _object(extra.get("metadata"))
    invocation = _object(extra.get("invocation_params"))
    model = str(
        metadata.get("ls_model_name")
        or invocation.get("model")
        or invocation.get("model_name")
        or inputs.get("model")
        or "imported"
    )
    messages = inputs.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], list):
        messages = messages[0]  # a batch of one prompt
    if not isinstance(messages, list) or not messages:
        raise ImportLineError(f"run {source_id}: inputs.messages must be a non-empty list")
    request: dict[str, Any] = {"model": model, "messages": [_message(m) for m in messages]}
    tools = inputs.get("tools") or invocation.get("tools")
    if isinstance(tools, list) and tools:
        request["tools"] = tools
    started = parse_time(run.get("start_time"))
    error = run.get("error")
    response = None
    if error is None:
        response = _response(run.get("outputs"), source_id, model, started)
    session = next(
        (metadata[k] for k in THREAD_KEYS if isinstance(metadata.get(k), str) and metadata[k]),
        None,
    )
    tags = {"langsmith.trace_id": str(run.get("trace_id") or "")}
    if run.get("name"):
        tags["langsmith.name"] = str(run["name"])
    return ImportedRecord(
        source_id=source_id,
        request=request,
        response=response,
        session_key=session,
        created_at=started,
        status="ok" if error is None else "error",
        error=text_of(error),
        latency_ms=latency_ms(started, parse_time(run.get("end_time"))),
        usage=response.get("usage") if response else None,
        tags=tags,
    )


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _response(outputs: Any, source_id: str, model: str, started: Any) -> dict[str, Any]:
    """``outputs.choices`` (an OpenAI completion, kept as it is) or the first of
    ``outputs.generations`` (LangChain), as a chat completion."""
    outputs = as_object(outputs, f"run {source_id}: outputs")
    choices = outputs.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        if not isinstance(choices[0].get("message"), dict):
            raise ImportLineError(f"run {source_id}: outputs.choices[0].message is missing")
        return dict(outputs)
    generations = outputs.get("generations")
    if isinstance(generations, list) and generations and isinstance(generations[0], list):
        generations = generations[0]
    if not isinstance(generations, list) or not generations:
        raise ImportLineError(f"run {source_id}: outputs hold neither choices nor generations")
    first = as_object(generations[0], "a generation")
    if isinstance(first.get("message"), dict):
        message = _message(first["message"])
    else:
        message = {"role": "assistant", "content": text_of(first.get("text")) or ""}
    response = assistant_response(source_id, model, {**message, "role": "assistant"}, started)
    usage = _usage(outputs, first)
    if usage is not None:
        response["usage"] = usage
    return response


def _message(value: Any) -> dict[str, Any]:
    """A chat message from OpenAI form (``role``) or LangChain's serialized forms
    (``{"lc": 1, "id": [..., "HumanMessage"], "kwargs": {...}}`` or
    ``{"type": "human", "data": {...}}``)."""
    message = as_object(value, "a message")
    if "role" in message:
        return message
    if "kwargs" in message and isinstance(message.get("id"), list) and message["id"]:
        kind, body = str(message["id"][-1]), message["kwargs"]
    else:
        kind, body = str(message.get("type")), message.get("data", message)
    role = _ROLES.get(kind)
    if role is None or not isinstance(body, dict):
        raise ImportLineError(f"unknown message type {kind!r}")
    out: dict[str, Any] = {"role": role, "content": body.get("content")}
    calls = body.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_tool_call(c) for c in calls]
    elif isinstance((body.get("additional_kwargs") or {}).get("tool_calls"), list):
        out["tool_calls"] = body["additional_kwargs"]["tool_calls"]
    if role == "assistant" and out.get("tool_calls") and out["content"] == "":
        out["content"] = None
    if role == "tool":
        out["tool_call_id"] = body.get("tool_call_id")
    return out


def _tool_call(value: Any) -> dict[str, Any]:
    """A LangChain tool call (``name``, ``args``, ``id``) in OpenAI form."""
    call = as_object(value, "a tool call")
    if "function" in call:
        return call
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args") or {})},
    }


def _usage(outputs: dict[str, Any], generation: dict[str, Any]) -> dict[str, int] | None:
    llm_output = outputs.get("llm_output")
    if isinstance(llm_output, dict) and isinstance(llm_output.get("token_usage"), dict):
        return llm_output["token_usage"]  # type: ignore[no-any-return]
    message = generation.get("message")
    body = message.get("kwargs", message) if isinstance(message, dict) else {}
    usage = body.get("usage_metadata") if isinstance(body, dict) else None
    if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
        return {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": int(usage.get("output_tokens") or 0),
            "total_tokens": int(usage.get("total_tokens") or 0),
        }
    return None


def _feedback(row: dict[str, Any]) -> ImportedFeedback:
    source_id, run_id = row.get("id"), row.get("run_id")
    if not isinstance(source_id, str) or not isinstance(run_id, str):
        raise ImportLineError("a feedback row needs its id and run_id")
    metadata: dict[str, Any] = {"key": row.get("key")}
    if row.get("value") is not None:
        metadata["value"] = row["value"]
    source = row.get("feedback_source")
    if isinstance(source, dict) and source.get("type"):
        metadata["feedback_source"] = source["type"]
    correction = _correction(row.get("correction"), metadata)
    return ImportedFeedback(
        source_id=source_id,
        score=as_score(row.get("score"), "feedback score"),
        record_sources=(run_id,),
        feedback=row.get("comment"),
        correction=correction,
        metadata=metadata,
    )


def _correction(value: Any, metadata: dict[str, Any]) -> Any:
    """The correct answer: text, an assistant message, or the one text field of an
    outputs object; any other shape is kept in the metadata, not trained on."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        if "tool_calls" in value or value.get("role") == "assistant":
            return value
        body = value.get("outputs", value)
        if isinstance(body, dict):
            texts = [body[k] for k in _CORRECTION_TEXT if isinstance(body.get(k), str)]
            if len(texts) == 1:
                return texts[0]
    metadata["correction"] = value
    return None
