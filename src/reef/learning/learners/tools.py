"""``tools``: better tool descriptions and orchestration settings, by reflection on the
turns where an agent misused its tools.

One run:

1. Misuse: training examples whose request offered tools and that went wrong — a
   correction made of tool calls (the call that should have been made), or a score
   below ``failure_score`` on a turn that called a tool or answered after a tool's
   result — worst first, at most ``max_cases``. Each is shown with its conversation
   (calls and results included), the reply's calls or text, its feedback and the
   correction.
2. Up to ``variants`` reflect calls, each shown the tools as they are offered now (with
   the head's ``tool_notes`` applied) and the cases, fenced as quoted data that carries
   no instructions (``_quoting``), asking for strict JSON:
   ``{"tools": {"<name>": {"description": str|null, "parameters": {"<param>": str}}},
   "tool_choice": "auto"|"required"|"none"|null, "max_turns": int|null}``. A reply is
   discarded (and counted) when it is not exactly that, names a tool or parameter the
   requests never offered, exceeds ``max_note_chars``, or trips ``scan_value`` (planted
   instructions); the first valid one is the proposal.
3. The candidate harness is the head's with those notes merged into ``tool_notes``
   (``reef.harness``: they rewrite the descriptions of the tools they name, the client's
   included) and ``orchestration.tool_choice`` / ``max_turns`` set where proposed. The
   gate then replays held-out tool turns, scored by ``tool_call``, to say whether the
   model calls better under it.

With ``scrub_personal_data`` (the default) the cases are scrubbed of personal data
(typed placeholders such as ``<EMAIL>``, ``<PHONE>``; ``reef.experience``) before the
reflector sees them, and so are the notes it proposes, counted in ``metrics.scrubbed``.

Raises ``NoCandidateError`` when no turn misused a tool, no variant is valid, or the
proposal changes nothing.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.experience import scrub_personal_text
from reef.harness import Harness, ToolNote, scan_value
from reef.learning.base import (
    Learner,
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._errors import NoCandidateError
from reef.learning.learners._examples import scrubbed_example, transcript_line
from reef.learning.learners._harness import head_bundle, replace_fields, store_bundle
from reef.learning.learners._quoting import reflection_messages as quoted_reflection

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

PROMPT = """You improve how an AI agent's tools are documented.
The quoted data below holds the tools the agent is offered, as it sees them now, then
turns where it used them badly: the conversation, what it did, the feedback and, where
given, what it should have done. Rewrite the descriptions of the tools involved (and of
their parameters) so that an agent reading them would act right in these cases, staying
true to what each tool does. You may also set tool_choice (auto, required or none) and
max_turns.
"""

ANSWER_FORMAT = """Answer with ONLY a JSON object, no prose and no code fences, exactly of
this form:
{"tools": {"<tool name>": {"description": "<new description, or null to keep it>",
                           "parameters": {"<parameter name>": "<new description>"}}},
 "tool_choice": null, "max_turns": null}
"""


class ToolsConfig(LearnerConfig):
    """Settings of the ``tools`` learner (module docstring)."""

    variants: int = Field(default=2, ge=1, le=8)
    failure_score: float = 0.5
    max_cases: int = Field(default=8, ge=1)
    max_note_chars: int = Field(default=1000, ge=10)
    scrub_personal_data: bool = True


class _Note(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    description: str | None = None
    parameters: dict[str, str] = Field(default_factory=dict)


class _Proposal(BaseModel):
    """The reflector's answer, strictly."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tools: dict[str, _Note] = Field(default_factory=dict)
    tool_choice: Literal["auto", "required", "none"] | None = None
    max_turns: int | None = Field(default=None, ge=1, le=100)


class ToolsLearner(Learner):
    """Rewrites the head harness's ``tool_notes`` and tool orchestration by reflection."""

    type_name: ClassVar[str] = "tools"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = ToolsConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """One reflective step (module docstring); raises ``NoCandidateError``."""
        config = self.config
        assert isinstance(config, ToolsConfig)
        cases = misuse(context.batch.train, config)
        if not cases:
            raise NoCandidateError("tools: no turn in the batch misused a tool")
        scrubbed: Counter[str] = Counter()
        if config.scrub_personal_data:
            cases = [scrubbed_example(e, scrubbed) for e in cases]
        bundle = head_bundle(context)
        offered = offered_tools(cases, bundle.harness)
        proposal, rejected = _propose(context, offered, cases, config)
        if config.scrub_personal_data:
            proposal = _scrubbed_proposal(proposal, scrubbed)
        harness = bundle.harness
        notes = {name: note.model_dump() for name, note in harness.tool_notes.items()}
        for name, note in proposal.tools.items():
            mine = notes.get(name, {"description": None, "parameters": {}})
            notes[name] = {
                "description": note.description or mine["description"],
                "parameters": {**mine["parameters"], **note.parameters},
            }
        orchestration = harness.orchestration.model_dump(mode="json")
        if proposal.tool_choice is not None:
            orchestration["tool_choice"] = proposal.tool_choice
        if proposal.max_turns is not None:
            orchestration["max_turns"] = proposal.max_turns
        new = replace_fields(bundle, tool_notes=notes, orchestration=orchestration)
        if new.harness == harness:
            raise NoCandidateError("tools: the proposal changes nothing")
        digest = store_bundle(context, new)
        consumed = [rid for e in cases for rid in (e.source_ids or (e.record_id,))]
        return LearnerOutput(
            harness=digest,
            consumed=list(dict.fromkeys(consumed)),
            metrics={
                "cases": len(cases),
                "tools_noted": sorted(proposal.tools),
                "variants_rejected": rejected,
                "tool_choice": proposal.tool_choice,
                "max_turns": proposal.max_turns,
                "scrubbed": dict(sorted(scrubbed.items())),
            },
        )


def _propose(
    context: LearnerContext,
    offered: dict[str, dict[str, Any]],
    cases: list[TrainingExample],
    config: ToolsConfig,
) -> tuple[_Proposal, dict[str, int]]:
    """The first valid proposal of up to ``variants`` reflect calls, and why the others
    were discarded; raises ``NoCandidateError`` when none is valid."""
    rejected: dict[str, int] = {}
    for index in range(config.variants):
        context.progress.report(index / config.variants, f"reflecting ({index + 1})")
        try:
            text = context.reflector.reflect(reflection_messages(offered, cases))
        except Exception:  # the reflector is a model call: a failure costs one variant
            rejected["reflect failed"] = rejected.get("reflect failed", 0) + 1
            continue
        proposal, reason = parse_proposal(text, offered, config)
        if proposal is not None:
            return proposal, rejected
        rejected[reason] = rejected.get(reason, 0) + 1
    described = ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items()))
    raise NoCandidateError(f"tools: no valid variant ({described})")


def misuse(train: list[TrainingExample], config: ToolsConfig) -> list[TrainingExample]:
    """Tool-using turns that went wrong, worst first (module docstring)."""
    found = []
    for example in train:
        if not example.tools:
            continue
        corrected = isinstance(example.correction, dict) and "tool_calls" in example.correction
        low = example.score is not None and example.score < config.failure_score
        used_tools = bool((example.response or {}).get("tool_calls")) or any(
            m.get("role") == "tool" for m in example.messages
        )
        if corrected or (low and used_tools):
            found.append(example)
    found.sort(key=lambda e: (e.score if e.score is not None else -1e9, e.record_id))
    return found[: config.max_cases]


def offered_tools(cases: list[TrainingExample], harness: Harness) -> dict[str, dict[str, Any]]:
    """Function name -> the function (name, description, parameters) as the cases'
    requests offered it, with the head's notes applied."""
    offered: dict[str, dict[str, Any]] = {}
    for example in cases:
        for tool in example.tools:
            function = tool.get("function") if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                offered.setdefault(function["name"], json.loads(json.dumps(function)))
    for name, note in harness.tool_notes.items():
        if name in offered:
            _apply(offered[name], note)
    return offered


def _apply(function: dict[str, Any], note: ToolNote) -> None:
    if note.description is not None:
        function["description"] = note.description
    properties = (function.get("parameters") or {}).get("properties") or {}
    for parameter, text in note.parameters.items():
        if isinstance(properties.get(parameter), dict):
            properties[parameter]["description"] = text


def reflection_messages(
    offered: dict[str, dict[str, Any]], cases: list[TrainingExample]
) -> list[dict[str, Any]]:
    """The chat messages that ask the reflector for better tool documentation: the tools
    and the cases go in as quoted data (``_quoting``), which carries no instructions."""
    parts = ["## Tools\n" + "\n".join(json.dumps(f) for f in offered.values())]
    for number, example in enumerate(cases, start=1):
        lines = [transcript_line(message) for message in example.messages]
        did = transcript_line({"role": "assistant", **(example.response or {})})
        parts.append(f"## Case {number} (score {example.score})\n" + "\n".join(lines) + f"\n{did}")
        if example.feedback:
            parts.append("feedback: " + "; ".join(str(f) for f in example.feedback))
        if example.correction is not None:
            should = example.correction
            if isinstance(should, dict):
                should = transcript_line({"role": "assistant", **should})
            parts.append(f"should have been: {should}")
    return quoted_reflection(PROMPT, "\n\n".join(parts), ANSWER_FORMAT)


def _scrubbed_proposal(proposal: _Proposal, counts: Counter[str]) -> _Proposal:
    """``proposal`` with personal data in its notes replaced by typed placeholders."""
    tools = {
        name: _Note(
            description=None
            if note.description is None
            else scrub_personal_text(note.description, counts),
            parameters={k: scrub_personal_text(v, counts) for k, v in note.parameters.items()},
        )
        for name, note in proposal.tools.items()
    }
    return proposal.model_copy(update={"tools": tools})


def parse_proposal(
    text: str, offered: dict[str, dict[str, Any]], config: ToolsConfig
) -> tuple[_Proposal | None, str]:
    """The strict proposal in ``text``, or None with why it was discarded."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        proposal = _Proposal.model_validate(json.loads(body))
    except (ValueError, ValidationError):
        return None, "malformed"
    for name, note in proposal.tools.items():
        function = offered.get(name)
        if function is None:
            return None, "unknown tool"
        properties = (function.get("parameters") or {}).get("properties") or {}
        if any(parameter not in properties for parameter in note.parameters):
            return None, "unknown parameter"
        texts = [note.description or "", *note.parameters.values()]
        if any(len(t) > config.max_note_chars for t in texts):
            return None, "too long"
    if scan_value(proposal.model_dump(), "proposal"):
        return None, "injection"
    if not proposal.tools and proposal.tool_choice is None and proposal.max_turns is None:
        return None, "empty"
    return proposal, ""
