"""Scorers of agent turns: ``tool_call`` compares the tool calls a reply made with the
reference's, ``turn`` scores a reply against a reference that is either text or tool
calls, whichever it is. Registered in the ``reef.scorers`` entry-point group.

A reference of tool calls is ``{"tool_calls": [...]}`` (an assistant message, as a
tool-call correction is stored), a list of calls, or one call. A call may be in OpenAI
form (``{"type": "function", "function": {"name", "arguments"}}``, ``arguments`` a JSON
string or an object), the short form ``{"name", "arguments"}``, or Anthropic's
``{"type": "tool_use", "name", "input"}``. Calls are equal when their function names are
equal and their arguments are equal as JSON values (``1`` equals ``1.0``; key order and
whitespace never matter); ``arguments`` options loosen that per argument name.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from reef.evaluation.scorers.base import (
    Scorer,
    ScorerConfig,
    ScorerContext,
    ScorerError,
    ScorerRegistry,
)
from reef.evaluation.scorers.builtin import normalize_text
from reef.evaluation.values import EvalItem, Reply, ScoreResult

ArgumentRule = Literal["exact", "normalized", "number", "ignore"]
_MISSING = object()


@dataclass(frozen=True)
class Call:
    """A tool call reduced to what is compared: the function's name and its arguments
    as a JSON value (the raw text when the arguments are not JSON)."""

    name: str
    arguments: Any

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for a score's details."""
        return {"name": self.name, "arguments": self.arguments}


def tool_call_reference(value: Any) -> list[Call] | None:
    """The calls a reference names, or None when it names none (a text reference)."""
    if isinstance(value, dict) and "tool_calls" in value:
        raw = value["tool_calls"]
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        raw = value
    elif isinstance(value, dict) and ("function" in value or "name" in value):
        raw = [value]
    else:
        return None
    if not isinstance(raw, list) or not raw:
        return None
    calls = [as_call(entry) for entry in raw]
    return None if any(call is None for call in calls) else [c for c in calls if c is not None]


def as_call(entry: Any) -> Call | None:
    """One call in any of the accepted forms (module doc); None when it is none."""
    if not isinstance(entry, dict):
        return None
    if entry.get("type") == "tool_use":
        name, arguments = entry.get("name"), entry.get("input", {})
    elif isinstance(entry.get("function"), dict):
        name, arguments = entry["function"].get("name"), entry["function"].get("arguments")
    else:
        name, arguments = entry.get("name"), entry.get("arguments")
    if not isinstance(name, str) or not name:
        return None
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # else compared as the raw text it is
            arguments = json.loads(arguments) if arguments.strip() else {}
    return Call(name, arguments)


class ToolCallConfig(ScorerConfig):
    """``order``: ``strict`` (the calls in the reference's order) or ``any`` (as a set of
    parallel calls). ``arguments``: a rule per argument name (``exact``: equal JSON
    values, the default; ``normalized``: equal text after case and whitespace folding;
    ``number``: equal numbers within ``tolerance``; ``ignore``: not compared).
    ``extra_arguments``: whether arguments the reference lacks are allowed. ``partial``:
    score the share of reference calls matched (extra calls count against it) instead of
    all or nothing."""

    order: Literal["strict", "any"] = "any"
    arguments: dict[str, ArgumentRule] = Field(default_factory=dict)
    extra_arguments: bool = False
    tolerance: float = Field(default=1e-6, ge=0.0)
    partial: bool = False


class ToolCallScorer(Scorer):
    """1 when the reply's tool calls equal the reference's (module doc), else 0 (or the
    matched share with ``partial``). A reply with no tool calls scores 0."""

    type_name: ClassVar[str] = "tool_call"
    config_model: ClassVar[type[ScorerConfig]] = ToolCallConfig
    config: ToolCallConfig

    def score(self, output: str, item: EvalItem) -> ScoreResult:
        """``output`` as the runner writes a reply's text: its last line, when it is a
        JSON list of calls, holds the calls."""
        return self.score_reply(reply_from_text(output), item)

    def score_reply(self, reply: Reply, item: EvalItem) -> ScoreResult:
        expected = tool_call_reference(item.reference)
        if expected is None:
            raise ScorerError(
                f"item {item.key!r}: scorer 'tool_call' needs a reference of tool calls "
                '({"tool_calls": [...]}, a list of calls or one call)'
            )
        return match_calls(expected, reply.tool_calls, self.config)


def reply_from_text(text: str) -> Reply:
    """The inverse of the runner's reply text: content, then the calls as one JSON line."""
    content, _, last = text.rpartition("\n")
    for candidate, rest in ((last, content), (text, "")):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, list) and value and all(as_call(v) is not None for v in value):
            return Reply(text, rest, tuple(value))
    return Reply(text, text, ())


def match_calls(
    expected: Sequence[Call], got_raw: Sequence[dict[str, Any]], config: ToolCallConfig
) -> ScoreResult:
    """Score the calls ``got_raw`` against ``expected`` under ``config``."""
    got = [as_call(call) for call in got_raw]
    details: dict[str, Any] = {
        "expected": [call.as_dict() for call in expected],
        "got": [
            call.as_dict() if call is not None else raw
            for call, raw in zip(got, got_raw, strict=True)
        ],
    }
    usable = [call for call in got if call is not None]
    if config.order == "strict":
        pairs = list(zip(expected, usable, strict=False))  # extra or missing: unmatched
        matched = sum(1 for want, have in pairs if _equal(want, have, config))
    else:
        matched = _matched_any_order(expected, usable, config)
    total = max(len(expected), len(got))
    details["matched"] = matched
    if config.partial:
        return ScoreResult(matched / total if total else 1.0, details)
    return ScoreResult(1.0 if matched == len(expected) == len(got) else 0.0, details)


def _matched_any_order(expected: Sequence[Call], got: list[Call], config: ToolCallConfig) -> int:
    left = list(got)
    matched = 0
    for want in expected:
        for index, have in enumerate(left):
            if _equal(want, have, config):
                matched += 1
                del left[index]
                break
    return matched


def _equal(want: Call, have: Call, config: ToolCallConfig) -> bool:
    if want.name != have.name:
        return False
    if not (isinstance(want.arguments, dict) and isinstance(have.arguments, dict)):
        return _same_json(want.arguments, have.arguments)
    names = set(want.arguments) | (set() if config.extra_arguments else set(have.arguments))
    for name in names:
        rule = config.arguments.get(name, "exact")
        if rule == "ignore":
            continue
        expected = want.arguments.get(name, _MISSING)
        actual = have.arguments.get(name, _MISSING)
        if expected is _MISSING or actual is _MISSING:
            return False
        if not _argument_equal(rule, expected, actual, config.tolerance):
            return False
    return True


def _argument_equal(rule: ArgumentRule, expected: Any, actual: Any, tolerance: float) -> bool:
    if rule == "normalized":
        return normalize_text(str(expected)) == normalize_text(str(actual))
    if rule == "number":
        try:
            return math.isclose(float(expected), float(actual), abs_tol=tolerance)
        except (TypeError, ValueError):
            return False
    return _same_json(expected, actual)


def _same_json(left: Any, right: Any) -> bool:
    """Equal as JSON values: numbers by value (``True`` is no number), lists in order,
    objects by key."""
    if isinstance(left, bool) or isinstance(right, bool):
        return left is right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return float(left) == float(right)
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same_json(left[k], right[k]) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same_json, left, right))
    return bool(type(left) is type(right) and left == right)


class TurnConfig(ScorerConfig):
    """``text``: the scorer spec for text references (default ``normalized_exact``);
    ``tool_call``: settings of the ``tool_call`` scorer for tool-call references."""

    text: dict[str, Any] | str = "normalized_exact"
    tool_call: ToolCallConfig = Field(default_factory=ToolCallConfig)


class TurnScorer(Scorer):
    """Scores an agent's turn against a reference that is text or tool calls: tool
    calls as ``tool_call`` does; text with the ``text`` scorer, on the reply's content,
    and 0 when the reply called a tool instead of answering."""

    type_name: ClassVar[str] = "turn"
    config_model: ClassVar[type[ScorerConfig]] = TurnConfig
    config: TurnConfig

    def __init__(self, config: ScorerConfig, context: ScorerContext) -> None:
        super().__init__(config, context)
        spec = self.config.text
        if (spec if isinstance(spec, str) else spec.get("type")) == self.type_name:
            raise ScorerError("scorer 'turn': its text scorer cannot be 'turn' itself")
        self._text = ScorerRegistry().build(spec, "turn.text", context)

    def score(self, output: str, item: EvalItem) -> ScoreResult:
        return self.score_reply(reply_from_text(output), item)

    def score_reply(self, reply: Reply, item: EvalItem) -> ScoreResult:
        expected = tool_call_reference(item.reference)
        if expected is not None:
            return match_calls(expected, reply.tool_calls, self.config.tool_call)
        if reply.tool_calls:
            called = [call.as_dict() for call in map(as_call, reply.tool_calls) if call]
            return ScoreResult(0.0, {"expected": "text", "got_tool_calls": called})
        return self._text.score(reply.content, item)
