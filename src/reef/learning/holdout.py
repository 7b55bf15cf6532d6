"""Connecting learning jobs to the evaluation gate.

A learning job that proposed a candidate hands it to the gate of its recipe (unless
``gate.enabled`` is false: then it waits ``pending`` for a person). The gate's holdout
items come from the scenario's held-out experience, selected without conditioning on
how the head did — every held-out record with feedback, not only the good ones — so the
comparison is not tilted toward the head: a record's reference is its correction, else
its served reply when its feedback says the reply was right
(``gate.holdout_reference_min_score``); records with neither are left out (a distilled
scenario's teacher answers are references too with ``gate.holdout_teacher_references``:
``teacher_items``). A turn that
was offered tools is asked again with them, and a reference made of tool calls is
scored by the ``tool_call`` scorer (name and arguments), whatever the gate's default. Each item
carries its provenance (the feedback authors who decided the reference and their trust),
so the gate can require independent evidence; feedback that screening flags or holds in
quarantine is no evidence at all.

``select_holdout`` also says what it left out: held-out records with no reference,
counted by why (``NO_REFERENCE``: a complaint but no corrected value, a low score but no
correction, a score neither right nor wrong, no feedback at all); ``dropped_sentence``
words the counts for the gate, which adds them to an "insufficient evidence" rejection.
``suite_prompts`` gives the gate's file-suite items to selection, which keeps them out of
training (``reef.learning.overlap``); ``evidence_notes`` carries both to the gate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from reef.config import ReefSettings
from reef.core import Progress
from reef.core.trust import trust_rank
from reef.evaluation import (
    EvalItem,
    EvaluationStore,
    EvidenceNotes,
    Gate,
    GateConfig,
    GatewayTarget,
    Provenance,
    ScorerContext,
    load_suite,
)
from reef.experience import ExperienceStore, LearningMeter, is_tool_call_correction, price_of
from reef.learning.base import ExperienceBatch, TrainingExample
from reef.learning.overlap import SuitePrompt, last_user_text
from reef.learning.recipes import Recipe
from reef.learning.reflect import UpstreamModels
from reef.learning.screening import TrustedReference, author_name
from reef.learning.selection import SelectionConfig, holdout_bucket, select_experience
from reef.learning.teacher import ReleaseManifests, answered_by_teacher, teacher_reference
from reef.releases import ArtifactStore, ReleaseChain
from reef.upstream.canonical import openai_chat_messages

HOLDOUT_SCAN_LIMIT = 100_000


# Why a held-out record gave no item, in the order the gate's reason lists them.
NO_REFERENCE: dict[str, str] = {
    "complaint_without_value": "had a complaint but no corrected value",
    "wrong_without_correction": "were scored wrong but given no correction",
    "neither_right_nor_corrected": (
        "had feedback that neither corrected the reply nor scored it right"
    ),
    "no_feedback": "had no feedback the gate counts as evidence",
}
OVERLAP_SAMPLE = 5


@dataclass(frozen=True)
class HeldOut:
    """The gate's held-out items, and how many held-out records gave none, by why
    (``NO_REFERENCE`` keys)."""

    items: list[EvalItem]
    skipped: dict[str, int] = field(default_factory=dict)


def holdout_items(
    store: ExperienceStore,
    chain: ReleaseChain,
    scenario: str,
    recipe: Recipe,
    now: datetime | None = None,
) -> list[EvalItem]:
    """The scenario's held-out experience as eval items (module docstring)."""
    return select_holdout(store, chain, scenario, recipe, now).items


def select_holdout(
    store: ExperienceStore,
    chain: ReleaseChain,
    scenario: str,
    recipe: Recipe,
    now: datetime | None = None,
) -> HeldOut:
    """The held-out items and the held-out records left without one (module docstring)."""
    selection = SelectionConfig(
        holdout_fraction=recipe.selection.holdout_fraction,
        holdout_key=recipe.selection.holdout_key,
        merge_sessions=recipe.selection.merge_sessions,
        credit=recipe.selection.credit,
        # Records without feedback are read too, only to be counted as skipped.
        require_feedback=False,
        reuse_consumed=True,
        max_per_principal=None,
        limit=HOLDOUT_SCAN_LIMIT,
        screening=recipe.selection.screening,
        sources=recipe.gate.evidence_sources,
    )
    trusted = trusted_references(recipe) if recipe.selection.screening.enabled else []
    batch = select_experience(store, chain, scenario, selection, now=now, trusted=trusted)
    # Past ``holdout_limit``, keep a fixed pseudo-random sample (by record id hash), not
    # the selection's priority order, which puts corrected items (the head's misses) first.
    held = sorted(batch.holdout, key=lambda e: (holdout_bucket(e.record_id + ":gate"), e.record_id))
    items: list[EvalItem] = []
    skipped: Counter[str] = Counter()
    teacher = teacher_items(chain) if recipe.gate.holdout_teacher_references else None
    for example in held:
        if len(items) >= recipe.gate.holdout_limit:
            break
        taught = None if teacher is None else teacher(example)
        if taught is not None:
            items.append(taught)
            continue
        if not example.principals:
            skipped["no_feedback"] += 1
            continue
        reference = _reference(example, recipe.gate.holdout_reference_min_score)
        if reference is not None:
            items.append(holdout_item(example, reference))
        else:
            skipped[_why_no_reference(example)] += 1
    return HeldOut(items, dict(skipped))


def teacher_items(chain: ReleaseChain) -> Callable[[TrainingExample], EvalItem | None]:
    """For ``gate.holdout_teacher_references``: a held-out record as an item when a
    distilled scenario's teacher answered it (``reef.learning.teacher``), its reference
    what the answer teaches (the correction; the answer unless feedback scored it
    negative); None for any other record, which the usual rule then decides. A reference
    Reef recorded from the configured teacher is the operator's evidence; a correction's
    is its authors'."""
    manifests = ReleaseManifests(chain)

    def item(example: TrainingExample) -> EvalItem | None:
        manifest = None if example.release_id is None else manifests(example.release_id)
        if not answered_by_teacher(example, manifest):
            return None
        reference = teacher_reference(example)
        if reference is None or manifest is None or manifest.routing is None:
            return None
        found = holdout_item(example, reference)
        if example.correction is not None:
            return found
        teacher = manifest.routing.teacher
        source = Provenance("holdout", "operator", (f"teacher:{teacher.upstream}/{teacher.model}",))
        return replace(found, provenance=source)

    return item


def _why_no_reference(example: TrainingExample) -> str:
    if example.complaint_without_value:
        return "complaint_without_value"
    if example.score is not None and example.score < 0.5:  # wrong, as calibration reads it
        return "wrong_without_correction"
    return "neither_right_nor_corrected"


def dropped_sentence(skipped: Mapping[str, int]) -> str | None:
    """``skipped`` in words, e.g. "12 held-out records had a complaint but no corrected
    value; 3 had no feedback"; None when nothing was skipped."""
    parts: list[str] = []
    for key, why in NO_REFERENCE.items():
        count = skipped.get(key, 0)
        if count:
            subject = (
                f"{count} held-out record{'s' if count != 1 else ''}" if not parts else str(count)
            )
            parts.append(f"{subject} {why}")
    return "; ".join(parts) or None


def suite_prompts(recipe: Recipe) -> list[SuitePrompt]:
    """The last user message of every item of the recipe's file suites, which selection
    keeps out of training (``reef.learning.overlap``)."""
    found: list[SuitePrompt] = []
    for path in recipe.gate.suites:
        for item in load_suite(Path(path)):
            prompt = last_user_text(item.messages)
            if prompt:
                found.append(SuitePrompt(item.key, prompt))
    return found


def evidence_notes(held: HeldOut, batch: ExperienceBatch | None) -> EvidenceNotes:
    """What the gate is told beside its items: the held-out records dropped, and the
    training records that matched a suite item (their count and the first few)."""
    details: dict[str, Any] = {}
    if held.skipped:
        details["holdout_skipped"] = dict(held.skipped)
    if batch is not None and batch.overlap:
        details["suite_overlap"] = overlap_summary(batch.overlap)
    return EvidenceNotes(dropped=dropped_sentence(held.skipped), details=details)


def overlap_summary(overlap: Mapping[str, str]) -> dict[str, Any]:
    """``{"count", "records": [{"record_id", "item"}, ...]}`` with the first few records."""
    first = sorted(overlap.items())[:OVERLAP_SAMPLE]
    return {
        "count": len(overlap),
        "records": [{"record_id": rid, "item": key} for rid, key in first],
    }


def holdout_item(example: TrainingExample, reference: Any) -> EvalItem:
    """A held-out turn as an eval item: its conversation in OpenAI chat form as the
    record holds it (``example.chat_messages``: images and tool history intact; else
    the canonical messages rendered back) and the tools it was offered (asked again
    with the same ``tools`` and ``tool_choice``); a reference of tool calls is scored
    by ``tool_call``, a text one by the gate's scorer. The record's tags become the
    item's as ``name=value`` (``gate.protect`` slices match them)."""
    params: dict[str, Any] = {}
    if example.tools:
        params["tools"] = list(example.tools)
        if example.tool_choice is not None:
            params["tool_choice"] = example.tool_choice
    return EvalItem(
        id=example.record_id,
        suite="holdout",
        messages=(
            example.chat_messages
            if example.chat_messages is not None
            else openai_chat_messages(example.messages)
        ),
        reference=reference,
        scorer={"type": "tool_call"} if is_tool_call_correction(reference) else None,
        params=params,
        tags=tuple(f"{name}={value}" for name, value in sorted(example.tags.items())),
        provenance=holdout_provenance(example),
    )


def holdout_provenance(example: TrainingExample) -> Provenance:
    """Who wrote a held-out item's reference: the authors of the feedback that decided
    it, with the lowest of their trust levels (``untrusted`` when none is known)."""
    authors = example.reference_authors
    if not authors:
        return Provenance("holdout", "untrusted", ("anonymous",))
    lowest = min((trust for _, trust in authors), key=trust_rank)
    return Provenance("holdout", lowest, tuple(author_name(p) for p, _ in authors))


def trusted_references(recipe: Recipe) -> list[TrustedReference]:
    """The recipe's file suites as (input, reference) pairs for feedback screening: the
    last user message and a text reference of every item that has both."""
    found: list[TrustedReference] = []
    for path in recipe.gate.suites:
        for item in load_suite(Path(path)):
            users = [m for m in item.messages if m.get("role") == "user"]
            prompt = users[-1].get("content") if users else None
            if isinstance(prompt, str) and isinstance(item.reference, str):
                found.append(TrustedReference(item.key, prompt, item.reference))
    return found


def _reference(example: TrainingExample, min_score: float) -> Any:
    """The correction (text, or ``{"tool_calls": [...]}``), else a reply its feedback
    calls right: its tool calls when it made any, else its text."""
    if example.correction is not None:
        if is_tool_call_correction(example.correction):
            return {"tool_calls": example.correction["tool_calls"]}
        return example.correction
    if example.score is not None and example.score >= min_score and example.response:
        if example.response.get("tool_calls"):
            return {"tool_calls": example.response["tool_calls"]}
        content = example.response.get("content")
        return content if isinstance(content, str) and content else None
    return None


def build_gate(  # noqa: PLR0913
    settings: ReefSettings,
    chain: ReleaseChain,
    evaluations: EvaluationStore,
    artifacts: ArtifactStore,
    scenario: str,
    recipe: Recipe,
    progress: Progress,
    upstream_base_urls: Mapping[str, str] | None = None,
    store: ExperienceStore | None = None,
    meter: LearningMeter | None = None,
) -> Gate:
    """The gate of ``recipe`` for ``scenario``, calling the configured gateway; with
    ``store``, its shadow records are the gate's shadow suite (``gate.shadow``); with
    ``meter``, its calls count against the learning budgets (``eval``; a model-graded
    scorer's as ``judge``; every one of them as ``gate`` too)."""
    target = gate_target(settings, scenario, recipe.gate)
    if meter is not None:
        meter = meter.gate()
        _, upstream = settings.upstream_for(scenario)
        model = settings.scenario(scenario).model or upstream.model
        target = replace(target, meter=meter, price=price_of(upstream.prices, model))
    models = UpstreamModels(settings, scenario, upstream_base_urls, meter=meter)
    return Gate(
        config=recipe.gate,
        publish=recipe.publish,
        chain=chain,
        artifacts=artifacts,
        evaluations=evaluations,
        target=target,
        scorer_context=ScorerContext(model=models),
        progress=progress,
        shadow_store=store,
    )


def gate_target(settings: ReefSettings, scenario: str, config: GateConfig) -> GatewayTarget:
    """Where and how the gate of ``scenario`` (and the skew check before it) asks its
    items: the configured gateway with the evaluation key, the gate's deadline, retries
    and concurrency, and the dialect of the scenario's upstream (the gateway serves an
    Anthropic upstream's scenario on ``/v1/messages`` only)."""
    key = settings.evaluation.api_key
    _, upstream = settings.upstream_for(scenario)
    return GatewayTarget(
        base_url=settings.gateway_url(),
        scenario=scenario,
        api_key=None if key is None else key.get_secret_value(),
        timeout_seconds=config.timeout_seconds,
        retries=config.retries,
        concurrency=config.concurrency,
        dialect="anthropic" if upstream.type == "anthropic" else "openai",
    )
