"""Teacher/student routing of a distilled scenario's release (docs/distillation.md).

Owns: which arm answers a request (``choose_arm``: the student takes ``student_share``
of requests, drawn from the request's record id so a request's draw can be reproduced),
the escalation rules run on the student's answer (``escalation_rule``; an OpenAI chat
or text completion, a Responses object or an Anthropic message: ``reply_of``), reading a
buffered stream far enough to run them (``StreamPeek``), what the record keeps of a
routed request (``RoutingOutcome``: tags), taking the token logprobs Reef asked for out
of an answer (``without_logprobs``: the student's for the logprob rule, the teacher's
for logit distillation), and the counts behind ``/metrics`` and ``/reef/status``
(``DistillStats``).
Does not own: calling the upstreams or recording (``reef.gateway.inference``), the
routing component itself (``reef.releases.RoutingComponent``).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from reef.core import dumps
from reef.core.prices import Tokens
from reef.core.routing import SERVED_BY_TAG
from reef.environments import schema_problem
from reef.releases import EscalationRules, RoutingComponent
from reef.upstream import UpstreamStream

Arm = Literal["student", "teacher"]
Rule = Literal["header", "refusal_or_empty", "invalid_tool_calls", "invalid_json", "logprob"]
ESCALATE_HEADER = "x-reef-escalate"
ESCALATION_TAG = "reef.escalation"
STUDENT_ATTEMPT_TAG = "reef.student_attempt"  # JSON: the student's escalated answer
MEAN_LOGPROB_TAG = "reef.student_mean_logprob"  # what the logprob rule read (calibration)

_HASH_RANGE = 1 << 64
_HOUR = 3600.0
# The opening of an obvious refusal (the answer's first words, apostrophes normalized).
_REFUSAL = re.compile(
    r"^\s*(i'?m sorry,? but |sorry,? but |i apologi[sz]e,? but )?"
    r"(i can ?not|i can't|i won't|i am unable to|i'm unable to|i'm not able to|"
    r"i am not able to)\s+(help|assist|comply|provide|do that|answer|fulfil)",
    re.IGNORECASE,
)


def student_first(routing: RoutingComponent | None) -> RoutingComponent | None:
    """``routing`` with the student answering first for every request (escalations
    still on) when it gives the student any share: how a pinned candidate is served."""
    if routing is None or routing.student_share <= 0:
        return routing
    return routing.model_copy(update={"student_share": 1.0})


def choose_arm(
    routing: RoutingComponent, record_id: str, escalate_header: str | None
) -> tuple[Arm, Rule | None]:
    """The arm that answers first, and ``header`` when the request asked for the
    teacher (rule on); else the student for ``student_share`` of record ids (a keyed
    hash read as a number in [0, 1), so one id always draws the same arm)."""
    if routing.escalation.header and _asks_teacher(escalate_header):
        return "teacher", "header"
    return ("student" if student_draw(record_id) < routing.student_share else "teacher"), None


def student_draw(record_id: str) -> float:
    """``record_id``'s draw in [0, 1)."""
    digest = hashlib.blake2b(record_id.encode(), digest_size=8, key=b"reef.distill").digest()
    return int.from_bytes(digest, "big") / _HASH_RANGE


def _asks_teacher(value: str | None) -> bool:
    return value is not None and value.strip().lower() == "teacher"


def wants_logprobs(rules: EscalationRules) -> bool:
    """Whether the student is asked for token logprobs (only when the rule uses them)."""
    return rules.min_mean_logprob is not None


def without_logprobs(data: dict[str, Any], *, as_null: bool = False) -> dict[str, Any]:
    """A chat completion without the token logprobs Reef asked for (not the client):
    each choice's ``logprobs`` left out, or (``as_null``) null where the choice has the
    field, as an OpenAI-compatible server answers a request that asked for none."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        return data
    kept = [_choice_without_logprobs(c, as_null) if isinstance(c, dict) else c for c in choices]
    return {**data, "choices": kept}


def _choice_without_logprobs(choice: dict[str, Any], as_null: bool) -> dict[str, Any]:
    if as_null:
        return {k: (None if k == "logprobs" else v) for k, v in choice.items()}
    return {k: v for k, v in choice.items() if k != "logprobs"}


def asked_logprobs(request: dict[str, Any]) -> bool:
    """Whether a chat request asked for token logprobs itself."""
    return bool(request.get("logprobs"))


@dataclass(frozen=True)
class Reply:
    """A student's answer in either dialect, as the rules read it."""

    text: str
    calls: list[tuple[str, Any]]  # (name, arguments: a JSON string or an object)
    refusal: bool
    logprobs: list[float]
    complete: bool = True  # False: the first tokens of a stream, not the whole answer

    @property
    def mean_logprob(self) -> float | None:
        """The mean of its token logprobs; None when none were sent."""
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else None


def reply_of(answer: dict[str, Any]) -> Reply:
    """The parts of an upstream's answer (OpenAI chat completion, legacy text
    completion, Responses API response or Anthropic message) that the rules read."""
    if answer.get("type") == "message" or "stop_reason" in answer:
        return _anthropic_reply(answer)
    if answer.get("object") == "response" or isinstance(answer.get("output"), list):
        return _responses_reply(answer)
    choices = answer.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    if isinstance(choice, dict) and "message" not in choice and "text" in choice:
        return _completion_reply(choice)
    message = choice.get("message") if isinstance(choice, dict) else None
    message = message if isinstance(message, dict) else {}
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append((str(function.get("name") or ""), function.get("arguments")))
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    values = [
        float(item["logprob"])
        for item in content or ()
        if isinstance(item, dict) and isinstance(item.get("logprob"), int | float)
    ]
    text = message.get("content")
    return Reply(
        text=text if isinstance(text, str) else "",
        calls=calls,
        refusal=bool(message.get("refusal")),
        logprobs=values,
    )


def _anthropic_reply(answer: dict[str, Any]) -> Reply:
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    for block in answer.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            calls.append((str(block.get("name") or ""), block.get("input")))
    return Reply("".join(texts), calls, answer.get("stop_reason") == "refusal", [])


def _completion_reply(choice: dict[str, Any]) -> Reply:
    """A legacy text completion's first choice: its text, and the sampled tokens'
    logprobs (``logprobs.token_logprobs``) when they were asked for."""
    text = choice.get("text")
    logprobs = choice.get("logprobs")
    tokens = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    values = [float(v) for v in tokens or () if isinstance(v, int | float)]
    return Reply(text if isinstance(text, str) else "", [], False, values)


def _responses_reply(answer: dict[str, Any]) -> Reply:
    """A Responses API response (an upstream's own, ``responses: native``): its
    messages' ``output_text`` and ``refusal`` parts and its ``function_call`` items."""
    texts: list[str] = []
    calls: list[tuple[str, Any]] = []
    refusal = False
    logprobs: list[float] = []
    for item in answer.get("output") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.append((str(item.get("name") or ""), item.get("arguments")))
            continue
        if item.get("type") != "message":
            continue
        for part in item.get("content") or ():
            if not isinstance(part, dict):
                continue
            if part.get("type") == "refusal":
                refusal = True
            elif part.get("type") == "output_text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
                logprobs.extend(
                    float(lp["logprob"])
                    for lp in part.get("logprobs") or ()
                    if isinstance(lp, dict) and isinstance(lp.get("logprob"), int | float)
                )
    return Reply("".join(texts), calls, refusal, logprobs)


def escalation_rule(rules: EscalationRules, request: dict[str, Any], reply: Reply) -> Rule | None:
    """The first rule that fires on the student's ``reply`` to ``request`` (the body as
    sent to the student, in its upstream's dialect: chat, text completion, Responses or
    Anthropic messages), or None: the answer stands.

    On a stream's first tokens (``reply.complete`` False) only what they can show is
    checked: a refusal, a tool the request does not offer, a low mean logprob.
    """
    if rules.refusal_or_empty and _refused_or_empty(reply):
        return "refusal_or_empty"
    if rules.invalid_tool_calls and _invalid_calls(request, reply):
        return "invalid_tool_calls"
    if rules.invalid_json and reply.complete and not reply.calls and _invalid_json(request, reply):
        return "invalid_json"
    threshold = rules.min_mean_logprob
    mean = reply.mean_logprob
    if threshold is not None and mean is not None and mean < threshold:
        return "logprob"
    return None


def _refused_or_empty(reply: Reply) -> bool:
    if reply.refusal:
        return True
    if reply.complete and not reply.text.strip() and not reply.calls:
        return True
    return bool(_REFUSAL.match(reply.text.replace("\u2019", "'")[:200]))


def _offered_tools(request: dict[str, Any]) -> dict[str, Any] | None:
    """The request's tools by name with their parameter schemas; None: no tools."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return None
    offered: dict[str, Any] = {}
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            offered[function["name"]] = function.get("parameters")
        elif isinstance(tool.get("name"), str) and tool.get("type") == "function":
            offered[tool["name"]] = tool.get("parameters")  # Responses: a flat function
        elif isinstance(tool.get("name"), str):  # Anthropic: name and input_schema
            offered[tool["name"]] = tool.get("input_schema")
    return offered


def _invalid_calls(request: dict[str, Any], reply: Reply) -> bool:
    if not reply.calls:
        return False
    offered = _offered_tools(request) or {}
    for name, arguments in reply.calls:
        if name not in offered:
            return True
        if not reply.complete:
            continue  # its arguments are still arriving
        if isinstance(arguments, str):
            try:
                arguments = orjson.loads(arguments or "{}")
            except orjson.JSONDecodeError:
                return True
        if not isinstance(arguments, dict) or _violates(arguments, offered[name]):
            return True
    return False


def _invalid_json(request: dict[str, Any], reply: Reply) -> bool:
    response_format = request.get("response_format")
    text = request.get("text")
    if not isinstance(response_format, dict) and isinstance(text, dict):
        response_format = _chat_format(text.get("format"))  # a Responses request's
    if not isinstance(response_format, dict):
        return False
    kind = response_format.get("type")
    if kind not in ("json_object", "json_schema"):
        return False
    try:
        document = orjson.loads(reply.text)
    except orjson.JSONDecodeError:
        return True
    if kind == "json_object":
        return not isinstance(document, dict)
    spec = response_format.get("json_schema")
    return _violates(document, spec.get("schema") if isinstance(spec, dict) else None)


def _chat_format(fmt: Any) -> dict[str, Any] | None:
    """A Responses ``text.format`` as chat's ``response_format`` (its ``json_schema``
    is flat: ``schema`` beside ``name``)."""
    if not isinstance(fmt, dict):
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": fmt}
    return fmt


def _violates(document: Any, schema: Any) -> bool:
    try:
        return schema_problem(document, schema) is not None
    except Exception:  # a schema jsonschema cannot use checks nothing
        return False


@dataclass
class RoutingOutcome:
    """What a routed request's record keeps: the arm that answered, the rule that
    escalated (if one did), and the student's escalated answer with its cost."""

    served_by: Arm
    rule: Rule | None = None
    student_attempt: dict[str, Any] | None = None
    student_tokens: Tokens | None = None
    student_cost: float | None = None
    mean_logprob: float | None = None

    def tags(self) -> dict[str, str]:
        """The record's tags for it (``reef.served_by``, ``reef.escalation``,
        ``reef.student_attempt``)."""
        tags: dict[str, str] = {SERVED_BY_TAG: self.served_by}
        if self.rule is not None:
            tags[ESCALATION_TAG] = self.rule
        if self.student_attempt is not None:
            tags[STUDENT_ATTEMPT_TAG] = dumps(self.student_attempt).decode()
        if self.mean_logprob is not None:
            tags[MEAN_LOGPROB_TAG] = f"{self.mean_logprob:.4f}"
        return tags


class StreamPeek:
    """The first events of a student's stream, read far enough to run the rules:
    OpenAI chat or text-completion chunks (``openai``), Responses API events
    (``responses``: an upstream's own, ``responses: native``) or Anthropic events
    (``anthropic``), one token per content or argument piece."""

    def __init__(self, dialect: Literal["openai", "anthropic", "responses"]) -> None:
        self.dialect = dialect
        self.tokens = 0
        self.ended = False
        self._buffer = b""
        self._text: list[str] = []
        self._calls: dict[int, list[Any]] = {}
        self._refusal = False
        self._logprobs: list[float] = []

    def feed(self, chunk: bytes) -> None:
        """Read the complete SSE lines of ``chunk`` (a partial line waits for the next)."""
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.ended = True
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        if self.dialect == "anthropic":
            self._anthropic_event(event)
            return
        if self.dialect == "responses":
            self._responses_event(event)
            return
        for choice in event.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if isinstance(choice.get("text"), str):  # a legacy text completion's chunk
                self._completion_choice(choice)
            elif isinstance(choice.get("delta"), dict):
                self._chat_choice(choice, choice["delta"])

    def _chat_choice(self, choice: dict[str, Any], delta: dict[str, Any]) -> None:
        if isinstance(delta.get("content"), str) and delta["content"]:
            self._text.append(delta["content"])
            self.tokens += 1
        if delta.get("refusal"):
            self._refusal = True
        for call in delta.get("tool_calls") or ():
            function = call.get("function") or {}
            slot = self._calls.setdefault(int(call.get("index") or 0), ["", ""])
            slot[0] += function.get("name") or ""
            slot[1] += function.get("arguments") or ""
            self.tokens += 1
        logprobs = choice.get("logprobs")
        for item in (logprobs or {}).get("content") or ():
            if isinstance(item, dict) and isinstance(item.get("logprob"), int | float):
                self._logprobs.append(float(item["logprob"]))
        if choice.get("finish_reason"):
            self.ended = True

    def _completion_choice(self, choice: dict[str, Any]) -> None:
        if choice["text"]:
            self._text.append(choice["text"])
            self.tokens += 1
        logprobs = choice.get("logprobs")
        tokens = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        self._logprobs.extend(float(v) for v in tokens or () if isinstance(v, int | float))
        if choice.get("finish_reason"):
            self.ended = True

    def _responses_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        index = int(event.get("output_index") or 0)
        if kind == "response.output_text.delta":
            self._text.append(str(event.get("delta") or ""))
            for item in event.get("logprobs") or ():
                if isinstance(item, dict) and isinstance(item.get("logprob"), int | float):
                    self._logprobs.append(float(item["logprob"]))
            self.tokens += 1
        elif kind == "response.refusal.delta":
            self._refusal = True
            self.tokens += 1
        elif kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                self._calls[index] = [str(item.get("name") or ""), ""]
        elif kind == "response.function_call_arguments.delta" and index in self._calls:
            self._calls[index][1] += str(event.get("delta") or "")
            self.tokens += 1
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            self.ended = True

    def _anthropic_event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        index = int(event.get("index") or 0)
        if kind == "content_block_start":
            block = event.get("content_block") or {}
            if block.get("type") == "tool_use":
                self._calls[index] = [str(block.get("name") or ""), ""]
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                self._text.append(str(delta.get("text") or ""))
            elif delta.get("type") == "input_json_delta" and index in self._calls:
                self._calls[index][1] += str(delta.get("partial_json") or "")
            self.tokens += 1
        elif kind == "message_delta":
            if (event.get("delta") or {}).get("stop_reason") == "refusal":
                self._refusal = True
        elif kind == "message_stop":
            self.ended = True

    def reply(self) -> Reply:
        """What has arrived, as the rules read it (complete once the stream ended)."""
        calls = [(name, arguments) for name, arguments in self._calls.values()]
        return Reply("".join(self._text), calls, self._refusal, self._logprobs, self.ended)


class ResumedStream(UpstreamStream):
    """A stream whose first chunks were read to run the rules: those chunks, then the
    rest from the same iterator."""

    def __init__(self, stream: UpstreamStream, chunks: AsyncIterator[bytes], read: list[bytes]):
        self.status = stream.status
        self.content_type = stream.content_type
        self.max_line_bytes = stream.max_line_bytes
        self._stream = stream
        self._chunks = chunks
        self._read = read

    async def _all(self) -> AsyncIterator[bytes]:
        while self._read:
            yield self._read.pop(0)
        async for chunk in self._chunks:
            yield chunk

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._all()

    async def aclose(self) -> None:
        await self._stream.aclose()


@dataclass
class _ScenarioCounts:
    arms: Counter[str] = field(default_factory=Counter)
    escalations: Counter[str] = field(default_factory=Counter)
    teacher_calls: int = 0
    recent_teacher: deque[float] = field(default_factory=deque)


class DistillStats(Collector):
    """Routed requests per scenario: by arm, escalations by rule, teacher calls (the
    last hour's kept for a rate). Read by ``/metrics`` and ``/reef/status``."""

    def __init__(self) -> None:
        self.scenarios: dict[str, _ScenarioCounts] = {}
        self.shares: dict[str, float] = {}

    def count(self, scenario: str, share: float, outcome: RoutingOutcome) -> None:
        """Count one routed request's outcome."""
        counts = self.scenarios.setdefault(scenario, _ScenarioCounts())
        self.shares[scenario] = share
        counts.arms[outcome.served_by] += 1
        if outcome.rule is not None:
            counts.escalations[outcome.rule] += 1
        if outcome.served_by == "teacher":
            counts.teacher_calls += 1
            now = time.monotonic()
            counts.recent_teacher.append(now)
            while counts.recent_teacher and counts.recent_teacher[0] < now - _HOUR:
                counts.recent_teacher.popleft()

    def collect(self) -> Iterator[CounterMetricFamily]:
        """The ``/metrics`` counters: requests by arm, escalations by rule and teacher
        calls, per scenario."""
        arms = CounterMetricFamily(
            "reef_distill_requests",
            "Requests of distilled releases by the arm that answered (student, teacher).",
            labels=["scenario", "arm"],
        )
        rules = CounterMetricFamily(
            "reef_distill_escalations",
            "Requests handed from the student to the teacher, by the rule that fired.",
            labels=["scenario", "rule"],
        )
        teacher = CounterMetricFamily(
            "reef_distill_teacher_calls", "Calls to the teacher.", labels=["scenario"]
        )
        for name, counts in sorted(self.scenarios.items()):
            for arm in ("student", "teacher"):
                arms.add_metric([name, arm], counts.arms[arm])
            for rule, count in sorted(counts.escalations.items()):
                rules.add_metric([name, rule], count)
            teacher.add_metric([name], counts.teacher_calls)
        yield arms
        yield rules
        yield teacher

    def status_json(self) -> dict[str, Any]:
        """Per scenario: the student share served, requests by arm, the escalation rate
        (escalated / requests the student answered first) and teacher calls in the last
        hour."""
        out: dict[str, Any] = {}
        now = time.monotonic()
        for name, counts in sorted(self.scenarios.items()):
            escalated = sum(counts.escalations.values()) - counts.escalations["header"]
            first = counts.arms["student"] + escalated  # the student answered first
            out[name] = {
                "student_share": self.shares.get(name, 0.0),
                "requests": dict(counts.arms),
                "escalations": dict(counts.escalations),
                "escalation_rate": (escalated / first) if first else 0.0,
                "teacher_calls_total": counts.teacher_calls,
                "teacher_calls_last_hour": sum(
                    1 for t in counts.recent_teacher if t >= now - _HOUR
                ),
            }
        return out
