"""``langfuse``: Langfuse's traces / observations / scores as exported by its public API
(``GET /api/public/traces/{id}``: a trace with its ``observations`` and ``scores``;
``GET /api/public/observations``; ``GET /api/public/scores``) or its table export as
JSON Lines, one object a line. GENERATION observations become records, scores feedback.
Field mapping: docs/import-export.md."""

from __future__ import annotations

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


class LangfuseReader(ImportReader):
    """One trace (with its observations and scores), observation or score a line."""

    name = "langfuse"

    def sniff(self, line: Any) -> bool:
        if not isinstance(line, dict):
            return False
        trace = isinstance(line.get("observations"), list) and "sessionId" in line
        observation = "traceId" in line and "type" in line and "startTime" in line
        score = "traceId" in line and "dataType" in line
        return trace or observation or score

    def read(self, line: Any) -> ImportItem:
        row = as_object(line, "a langfuse line")
        if isinstance(row.get("observations"), list):
            return _trace(row)
        if "dataType" in row or ("value" in row and "type" not in row):
            return ImportItem((), (_score(row, ()),))
        return ImportItem((_generation(row, row.get("sessionId")),))


def _trace(trace: dict[str, Any]) -> ImportItem:
    session = trace.get("sessionId")
    generations = [
        o for o in trace["observations"] if isinstance(o, dict) and o.get("type") == "GENERATION"
    ]
    if not generations:
        raise ImportLineError(f"trace {trace.get('id')!r} holds no GENERATION observation objects")
    generations.sort(key=lambda o: str(o.get("startTime") or ""))
    records = tuple(_generation(o, session) for o in generations)
    ids = [r.source_id for r in records]
    scores = trace.get("scores") or []
    if not isinstance(scores, list):
        raise ImportLineError("trace scores must be a list")
    return ImportItem(records, tuple(_score(as_object(s, "a score"), ids) for s in scores))


def _generation(observation: dict[str, Any], session: Any) -> ImportedRecord:
    source_id = observation.get("id")
    if not isinstance(source_id, str) or not source_id:
        raise ImportLineError("an observation needs its id")
    if observation.get("type") != "GENERATION":
        raise ImportLineError(
            f"observation {source_id} is a {observation.get('type')}, not a GENERATION: "
            "nothing to learn from"
        )
    request = _request(observation.get("input"), observation)
    started = parse_time(observation.get("startTime"))
    failed = observation.get("level") == "ERROR"
    model = str(observation.get("model") or "imported")
    response = None
    if not failed:
        message = _answer(observation.get("output"), source_id)
        response = assistant_response(source_id, model, message, started)
        usage = _usage(observation.get("usageDetails") or observation.get("usage"))
        if usage is not None:
            response["usage"] = usage
    tags = {"langfuse.trace_id": str(observation.get("traceId") or "")}
    if observation.get("name"):
        tags["langfuse.name"] = str(observation["name"])
    return ImportedRecord(
        source_id=source_id,
        request=request,
        response=response,
        session_key=session if isinstance(session, str) and session else None,
        created_at=started,
        status="error" if failed else "ok",
        error=text_of(observation.get("statusMessage")) if failed else None,
        latency_ms=latency_ms(started, parse_time(observation.get("endTime"))),
        usage=response.get("usage") if response else None,
        tags=tags,
    )


def _request(value: Any, observation: dict[str, Any]) -> dict[str, Any]:
    """The chat request: ``input`` as a message list, ``{"messages": [...]}`` (an
    OpenAI request, ``tools`` kept) or a prompt string."""
    request: dict[str, Any] = {"model": str(observation.get("model") or "imported")}
    if isinstance(value, str):
        request["messages"] = [{"role": "user", "content": value}]
    elif isinstance(value, list):
        request["messages"] = value
    elif isinstance(value, dict) and isinstance(value.get("messages"), list):
        request.update({k: v for k, v in value.items() if k != "model"})
    else:
        raise ImportLineError("a generation's input must be chat messages or a prompt")
    if not request["messages"] or not all(isinstance(m, dict) for m in request["messages"]):
        raise ImportLineError("a generation's input must hold at least one message object")
    parameters = observation.get("modelParameters")
    if isinstance(parameters, dict):
        for key in ("temperature", "top_p", "max_tokens"):
            if isinstance(parameters.get(key), int | float):
                request.setdefault(key, parameters[key])
    return request


def _answer(value: Any, source_id: str) -> dict[str, Any]:
    """The assistant message: ``output`` as a message, a completion's first choice, or
    text."""
    if isinstance(value, str):
        return {"role": "assistant", "content": value}
    if isinstance(value, dict):
        choices = value.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            value = choices[0].get("message")
        if isinstance(value, dict) and ("content" in value or "tool_calls" in value):
            return {**value, "role": "assistant"}
    raise ImportLineError(f"generation {source_id} has no output message to learn from")


def _usage(value: Any) -> dict[str, int] | None:
    if not isinstance(value, dict):
        return None
    prompt, completion = value.get("input"), value.get("output")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    total = value.get("total")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total if isinstance(total, int) else prompt + completion,
    }


def _score(score: dict[str, Any], line_ids: list[str] | tuple[str, ...]) -> ImportedFeedback:
    """A score on a generation of this line (by ``observationId``, or the trace's last
    generation), or on one imported earlier (``observationId``)."""
    source_id = score.get("id")
    if not isinstance(source_id, str) or not source_id:
        raise ImportLineError("a score needs its id")
    target = score.get("observationId")
    indexes: tuple[int, ...] = ()
    sources: tuple[str, ...] = ()
    if isinstance(target, str) and target in line_ids:
        indexes = (list(line_ids).index(target),)
    elif isinstance(target, str) and target:
        sources = (target,)
    elif line_ids:
        indexes = (len(line_ids) - 1,)  # a trace-level score grades the trace's answer
    else:
        raise ImportLineError(
            f"score {source_id} names no observationId: import it inside its trace"
        )
    categorical = score.get("dataType") == "CATEGORICAL"
    metadata = {"name": score.get("name"), "data_type": score.get("dataType")}
    if score.get("source"):
        metadata["source"] = score["source"]
    if categorical or score.get("stringValue") is not None:
        metadata["label"] = score.get("stringValue")
    return ImportedFeedback(
        source_id=source_id,
        score=None if categorical else as_score(score.get("value"), "score value"),
        record_indexes=indexes,
        record_sources=sources,
        feedback=score.get("comment"),
        metadata=metadata,
    )
