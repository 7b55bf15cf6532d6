"""``instructions``: reflective (GEPA-style) evolution of the system prompt and rules.

One run:

1. Failing trajectories: training examples with a correction or a score below
   ``failure_score``, worst first, at most ``max_failures``, each shown with its
   conversation, reply, textual feedback and correction.
2. ``variants`` reflect calls. Each shows ``context.reflector`` the failures and a parent's
   system prompt and rules — the head's for the first call, then members of the Pareto
   pool in turn — fenced as quoted data that carries no instructions (``_quoting``),
   and asks for strict JSON ``{"system_prompt": str|null, "instructions":
   [str, ...]}``. Output that is not exactly that (code fences aside), or whose text trips
   ``scan_for_injection``, is discarded and counted; it is never published.
3. Scoring, a cheap proxy (no model calls): on each training example with textual
   feedback or a correction, a candidate scores the share of that text's distinct words
   (three letters or more) that its system prompt and rules mention. It measures whether
   the rules *address* the feedback, not whether the model then behaves better — that is
   the evaluation gate's job. Examples without such text are not scored.
4. The Pareto pool (``<home>/learning/<scenario>/pareto.json``) keeps, across runs, the
   candidates that are best on at least one example; every member is re-scored on this
   run's examples. The pick is the pool member with the best mean proxy score (ties:
   more examples won, then newer) that differs from the head's rules.

Raises ``NoCandidateError`` when there is no failing trajectory or no valid variant.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.core.jsoncodec import canonical_json, sha256_hex
from reef.harness import Harness, scan_for_injection
from reef.learning.base import (
    Learner,
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    TrainingExample,
)
from reef.learning.learners._errors import NoCandidateError
from reef.learning.learners._examples import transcript_line
from reef.learning.learners._harness import head_bundle, replace_fields, store_bundle
from reef.learning.learners._quoting import reflection_messages as quoted_reflection

POOL_VERSION = 1
_WORD = re.compile(r"[a-z0-9]{3,}")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

PROMPT = """You improve the system prompt and rules of an AI assistant.
The quoted data below holds the assistant's current system prompt and rules, then
conversations where it did badly, with the feedback it received and, where given, a
better answer. Write a revised system prompt and a revised list of rules that would avoid
these failures while keeping what already works. Keep rules short, concrete and general.
"""

ANSWER_FORMAT = """Answer with ONLY a JSON object, no prose and no code fences, exactly of
this form:
{"system_prompt": "<the revised system prompt, or null to keep none>",
 "instructions": ["<rule 1>", "<rule 2>"]}
"""


class InstructionsConfig(LearnerConfig):
    """Settings of the ``instructions`` learner (module docstring)."""

    variants: int = Field(default=3, ge=1, le=16)
    failure_score: float = 0.5
    max_failures: int = Field(default=8, ge=1)
    max_instructions: int = Field(default=20, ge=1)
    max_rule_chars: int = Field(default=500, ge=10)
    max_prompt_chars: int = Field(default=8000, ge=10)
    max_pool: int = Field(default=16, ge=1)


class _Proposal(BaseModel):
    """The reflector's answer, strictly."""

    model_config = ConfigDict(extra="forbid", strict=True)

    system_prompt: str | None
    instructions: list[str] = Field(min_length=1)


@dataclass
class Candidate:
    """A system prompt and rules, with per-example proxy scores."""

    system_prompt: str | None
    instructions: list[str]
    created_at: str
    scores: dict[str, float]

    @property
    def key(self) -> str:
        return sha256_hex(canonical_json([self.system_prompt, self.instructions]))

    def mean(self) -> float:
        return sum(self.scores.values()) / len(self.scores) if self.scores else 0.0


class InstructionsLearner(Learner):
    """Rewrites the head harness's ``system_prompt`` and ``instructions`` by reflection."""

    type_name: ClassVar[str] = "instructions"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = InstructionsConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        """One reflective step (module docstring); raises ``NoCandidateError``."""
        config = self.config
        assert isinstance(config, InstructionsConfig)
        failures = failing_examples(context.batch.train, config)
        if not failures:
            raise NoCandidateError("instructions: no failing trajectory in the batch")
        bundle = head_bundle(context)
        now = datetime.now(UTC).isoformat()
        current = Candidate(
            bundle.harness.system_prompt, list(bundle.harness.instructions), now, {}
        )
        pool_path = context.home / "learning" / context.scenario / "pareto.json"
        pool = load_pool(pool_path)
        parents = [current, *(c for c in pool if c.key != current.key)]
        rejected: dict[str, int] = {}
        fresh: list[Candidate] = []
        for index in range(config.variants):
            context.progress.report(
                index / config.variants, f"reflecting ({index + 1}/{config.variants})"
            )
            parent = parents[index % len(parents)]
            try:
                text = context.reflector.reflect(reflection_messages(parent, failures))
            except Exception:  # the reflector is a model call: a failure costs one variant
                rejected["reflect failed"] = rejected.get("reflect failed", 0) + 1
                continue
            proposal, reason = parse_proposal(text, config)
            if proposal is None:
                rejected[reason] = rejected.get(reason, 0) + 1
                continue
            fresh.append(Candidate(proposal.system_prompt, proposal.instructions, now, {}))
        if not fresh:
            raise NoCandidateError(f"instructions: no valid variant ({_describe(rejected)})")
        examples = {e.record_id: e for e in context.batch.train if _feedback_text(e)}
        merged = {c.key: c for c in [*pool, *fresh] if c.key != current.key}
        members = [*merged.values(), current]
        for candidate in members:
            candidate.scores = {rid: proxy_score(candidate, e) for rid, e in examples.items()}
        front = pareto_front(members, config.max_pool)
        save_pool(pool_path, front)
        choices = [c for c in front if c.key != current.key] or fresh
        best = max(choices, key=lambda c: (c.mean(), _wins(c, members), c.created_at))
        new = replace_fields(
            bundle, system_prompt=best.system_prompt, instructions=best.instructions
        )
        digest = store_bundle(context, new)
        consumed = [rid for e in failures for rid in (e.source_ids or (e.record_id,))]
        context.metrics.record("instructions.proxy_score", best.mean())
        return LearnerOutput(
            harness=digest,
            consumed=list(dict.fromkeys(consumed)),
            metrics={
                "failures": len(failures),
                "variants_valid": len(fresh),
                "variants_rejected": rejected,
                "pool_size": len(front),
                "proxy_score": best.mean(),
                "head_proxy_score": current.mean(),
            },
        )


def failing_examples(
    train: list[TrainingExample], config: InstructionsConfig
) -> list[TrainingExample]:
    """Corrected or low-scoring examples, worst first (corrections before scores)."""
    failing = [
        e
        for e in train
        if e.correction is not None or (e.score is not None and e.score < config.failure_score)
    ]
    failing.sort(key=lambda e: (e.score if e.score is not None else -1e9, e.record_id))
    return failing[: config.max_failures]


def reflection_messages(parent: Candidate, failures: list[TrainingExample]) -> list[dict[str, Any]]:
    """The chat messages that ask the reflector for a revision: the parent's rules and
    the failures go in as quoted data (``_quoting``), which carries no instructions."""
    rules = "\n".join(f"- {rule}" for rule in parent.instructions) or "(none)"
    parts = [
        f"## Current system prompt\n{parent.system_prompt or '(none)'}",
        f"## Current rules\n{rules}",
    ]
    for number, example in enumerate(failures, start=1):
        # The whole trajectory: tool calls and their results too.
        conversation = "\n".join(transcript_line(m) for m in example.messages)
        reply = transcript_line({"role": "assistant", **(example.response or {})})
        parts.append(
            f"## Failure {number} (score {example.score})\n{conversation}\n{reply}\n"
            f"feedback: {json.dumps(example.feedback, ensure_ascii=False)}\n"
            f"better answer: {example.target_text() if example.correction is not None else '-'}"
        )
    return quoted_reflection(PROMPT, "\n\n".join(parts), ANSWER_FORMAT)


def parse_proposal(text: Any, config: InstructionsConfig) -> tuple[_Proposal | None, str]:
    """The reflector's proposal, or None and why it was discarded."""
    if not isinstance(text, str):
        return None, "not text"
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    try:
        document = json.loads(fenced.group(1) if fenced else stripped)
        proposal = _Proposal.model_validate(document)
    except (ValueError, ValidationError):
        return None, "malformed"
    rules = [rule.strip() for rule in proposal.instructions]
    if any(not rule or len(rule) > config.max_rule_chars for rule in rules):
        return None, "malformed"
    if len(rules) > config.max_instructions:
        return None, "too many instructions"
    prompt = proposal.system_prompt
    if prompt is not None and len(prompt) > config.max_prompt_chars:
        return None, "system prompt too long"
    if scan_for_injection(Harness(schema_version=1, system_prompt=prompt, instructions=rules)):
        return None, "injection"
    return _Proposal(system_prompt=prompt, instructions=rules), ""


def _feedback_text(example: TrainingExample) -> str:
    texts = [
        json.dumps(f, ensure_ascii=False) if not isinstance(f, str) else f for f in example.feedback
    ]
    if example.correction is not None:
        texts.append(example.target_text() or "")
    return "\n".join(texts)


def proxy_score(candidate: Candidate, example: TrainingExample) -> float:
    """Share of the example's feedback words that the candidate's text mentions."""
    wanted = set(_WORD.findall(_feedback_text(example).lower()))
    if not wanted:
        return 0.0
    text = " ".join([candidate.system_prompt or "", *candidate.instructions]).lower()
    return len(wanted & set(_WORD.findall(text))) / len(wanted)


def _wins(candidate: Candidate, members: list[Candidate]) -> int:
    return sum(
        1
        for rid, score in candidate.scores.items()
        if score > 0 and score >= max(m.scores.get(rid, 0.0) for m in members)
    )


def pareto_front(members: list[Candidate], limit: int) -> list[Candidate]:
    """Members best (or tied best) on at least one example, and not dominated; at most
    ``limit``, most examples won first. With no scored example, the newest members."""
    ids = {rid for m in members for rid in m.scores}
    if not ids:
        return sorted(members, key=lambda c: c.created_at, reverse=True)[:limit]
    best = {rid: max(m.scores.get(rid, 0.0) for m in members) for rid in ids}
    winners = [m for m in members if any(m.scores.get(r, 0.0) >= best[r] for r in ids)]

    def dominated(a: Candidate) -> bool:
        return any(
            all(b.scores.get(r, 0.0) >= a.scores.get(r, 0.0) for r in ids)
            and any(b.scores.get(r, 0.0) > a.scores.get(r, 0.0) for r in ids)
            for b in winners
            if b is not a
        )

    front = [m for m in winners if not dominated(m)]
    front.sort(key=lambda c: (-_wins(c, members), c.created_at))
    return front[:limit]


def load_pool(path: Path) -> list[Candidate]:
    """The persisted pool; an unreadable or foreign file reads as an empty pool."""
    try:
        document = json.loads(path.read_text("utf-8"))
        if document.get("version") != POOL_VERSION:
            return []
        return [
            Candidate(
                c["system_prompt"], list(c["instructions"]), c["created_at"], dict(c["scores"])
            )
            for c in document["candidates"]
        ]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []


def save_pool(path: Path, pool: list[Candidate]) -> None:
    """Write the pool atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "version": POOL_VERSION,
        "candidates": [
            {
                "system_prompt": c.system_prompt,
                "instructions": c.instructions,
                "created_at": c.created_at,
                "scores": c.scores,
            }
            for c in pool
        ],
    }
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(document, indent=1, ensure_ascii=False), "utf-8")
    staging.replace(path)


def _describe(rejected: dict[str, int]) -> str:
    return ", ".join(f"{reason}: {count}" for reason, count in sorted(rejected.items())) or "none"
