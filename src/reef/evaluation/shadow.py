"""Shadow evidence: live requests answered again by the evaluating candidate, in the
background, and scored as the gate's ``shadow`` suite.

The gateway side (``reef.gateway.shadow``) sends a sampled share of a scenario's live
requests to its ``evaluating`` candidate after the live answer went out, and records each
answer with purpose ``shadow`` (never trained on, never held out: selection takes
``serve`` only), release id the candidate's, and tag ``reef.shadow_of`` naming the live
record. The gate stores the settings it reads on the candidate (``evidence["shadow"]``,
``with_shadow_settings``) when the candidate starts ``evaluating``.

``shadow_results`` turns the pairs into paired ``ItemResult``s (arm ``baseline``: the
live answer, ``candidate``: the shadow one) under suite ``shadow``, each with its
provenance in ``details``:

- ``live``: the live answer has a reference (a correction posted as feedback, from a
  source that ``gate.evidence_sources`` weighs above 0): both answers are scored by the
  scenario's scorer against it (a tool-call correction by ``tool_call``);
- ``judged``: otherwise the pairwise judge (``gate.shadow.judge``;
  ``reef.evaluation.judging``) prefers one answer (1 and 0) or neither (0.5 each). A
  verdict is computed evidence: judged pairs count only when ``gate.evidence_sources``
  weighs ``judge:shadow`` (or ``judge``) above 0; otherwise they are reported only.

A pair whose either answer is missing, or whose judge failed, is void: counted, never
scored. A judge flagged for position bias has none of its verdicts counted. The report
(the decision's ``evidence["shadow"]``) holds the counts, the judge's position check and
the suite's summary in all and per provenance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from reef.core.errors import NotFoundError
from reef.evaluation.config import GateConfig
from reef.evaluation.judging import PairVerdict, PairwiseJudge, position_bias
from reef.evaluation.runner import parse_reply
from reef.evaluation.scorers import ScorerContext, ScorerRegistry
from reef.evaluation.shadow_config import ShadowConfig
from reef.evaluation.stats import summarize
from reef.evaluation.suites import SHADOW_SUITE
from reef.evaluation.values import Decision, EvalItem, ItemResult, Reply
from reef.experience import (
    ExperienceStore,
    RecordDraft,
    RecordFilter,
    RecordView,
    canonical_exchange,
    model_call_draft,
)

SHADOW_EVIDENCE_KEY = "shadow"
SHADOW_BUDGETS_KEY = "learning_budget"  # under evidence["shadow"]: the recipe's budgets
SHADOW_OF_TAG = "reef.shadow_of"
JUDGE_SOURCE = "judge:shadow"
"""The source judged pairs are weighed as in ``gate.evidence_sources`` (0 by default)."""
_PAGE = 500


def with_shadow_settings(
    evidence: Mapping[str, Any] | None,
    config: ShadowConfig | None,
    budgets: Sequence[tuple[str, Sequence[Any]]] = (),
) -> dict[str, Any] | None:
    """A candidate's evidence with the traffic settings of ``config`` under
    ``evidence["shadow"]`` (what the gateway reads); ``evidence`` as it is without.
    ``budgets`` (``(scope, limits)``, the gate's learning budgets: ``LearningBudgetLimit``
    each) whose ``recipe:`` scopes count purpose ``shadow`` go with them
    (``learning_budget``): the gateway charges shadow calls to them and to the
    scenario's own."""
    if config is None:
        return None if evidence is None else dict(evidence)
    settings = config.model_dump(exclude={"judge"})
    counted = [
        {"scope": scope, "limits": [limit.model_dump(mode="json") for limit in shadowed]}
        for scope, limits in budgets
        if scope.startswith("recipe:")
        and (shadowed := [limit for limit in limits if limit.purpose in ("shadow", "total")])
    ]
    if counted:
        settings[SHADOW_BUDGETS_KEY] = counted
    return {**(evidence or {}), SHADOW_EVIDENCE_KEY: settings}


def shadow_settings(evidence: Mapping[str, Any] | None) -> ShadowConfig | None:
    """The shadow settings a candidate's evidence holds; None when it holds none valid."""
    raw = (evidence or {}).get(SHADOW_EVIDENCE_KEY)
    if not isinstance(raw, dict):
        return None
    try:
        return ShadowConfig.model_validate(
            {k: v for k, v in raw.items() if k not in ("judge", SHADOW_BUDGETS_KEY)}
        )
    except ValueError:
        return None


def shadow_budgets(
    evidence: Mapping[str, Any] | None,
) -> list[tuple[str, list[dict[str, Any]]]]:
    """The recipe budgets counting shadow calls that a candidate's evidence holds
    (``with_shadow_settings``), each limit as stored (the gateway validates them); an
    entry without a scope or a list of limits is left out."""
    raw = ((evidence or {}).get(SHADOW_EVIDENCE_KEY) or {}).get(SHADOW_BUDGETS_KEY)
    found: list[tuple[str, list[dict[str, Any]]]] = []
    for entry in raw if isinstance(raw, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("limits"), list):
            continue
        limits = [limit for limit in entry["limits"] if isinstance(limit, dict)]
        found.append((str(entry.get("scope")), limits))
    return found


@dataclass(frozen=True)
class ShadowPair:
    """A live answer and the candidate's shadow answer to the same request."""

    live: RecordView
    shadow: RecordView


@dataclass(frozen=True)
class ShadowEvidence:
    """The shadow suite's results and what was counted on the way (``report``)."""

    results: list[ItemResult] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    flagged: str | None = None


def shadow_pairs(
    store: ExperienceStore, scenario: str, candidate_id: str, limit: int
) -> list[ShadowPair]:
    """The candidate's first ``limit`` shadow records with their live records (oldest
    first); a shadow record whose live record is gone is left out."""
    found: list[RecordView] = []
    cursor: str | None = None
    while True:
        page = store.list_records(scenario, RecordFilter(purpose="shadow"), cursor, _PAGE)
        found += [r for r in page.records if r.release_id == candidate_id]
        cursor = page.next_cursor
        if cursor is None:
            break
    found.sort(key=lambda r: (r.created_at, r.id))
    pairs = []
    for shadow in found[:limit]:
        live_id = shadow.tags.get(SHADOW_OF_TAG)
        if live_id is None:
            continue
        try:
            live = store.get_record(live_id)
        except NotFoundError:
            continue
        pairs.append(ShadowPair(live, shadow))
    return pairs


def shadow_results(
    store: ExperienceStore,
    scenario: str,
    candidate_id: str,
    config: GateConfig,
    registry: ScorerRegistry,
    context: ScorerContext,
) -> ShadowEvidence:
    """The shadow suite of ``candidate_id`` (module docstring); empty without
    ``gate.shadow``."""
    shadow = config.shadow
    if shadow is None:
        return ShadowEvidence()
    pairs = shadow_pairs(store, scenario, candidate_id, shadow.max_requests)
    judge = None
    calls = StoredJudgeCalls(store, scenario, candidate_id)
    if shadow.judge is not None and context.model is not None:
        judge = PairwiseJudge(context.model, shadow.judge, calls)
    counts = {"pairs": len(pairs), "live": 0, "judged": 0, "void": 0, "unscored": 0}
    counts["references"] = _references(pairs, config)
    results: list[ItemResult] = []
    verdicts: list[PairVerdict] = []
    for pair in pairs:
        kind, rows = _score_pair(pair, config, registry, context, judge, verdicts)
        counts[kind] += 1
        results += rows
    report: dict[str, Any] = dict(counts)
    flagged = None
    if counts["judged"] and source_weight(config.evidence_sources, JUDGE_SOURCE) <= 0:
        report["judged_counted"] = False
        report["judged_reason"] = (
            f"gate.evidence_sources weighs {JUDGE_SOURCE} (a judge's verdict is computed "
            "evidence) at 0: judged pairs are reported, not counted"
        )
        results = [r for r in results if r.details.get("provenance") != "judged"]
    if shadow.judge is not None:
        bias = position_bias(verdicts, shadow.judge.max_position_flips)
        report["judge"] = {
            "upstream": shadow.judge.upstream,
            "model": shadow.judge.model,
            **bias.as_dict(),
        }
        if bias.flagged:
            flagged = (
                f"shadow judge {shadow.judge.model!r} flagged for position bias: "
                f"{bias.flips} of {bias.checked} pairs judged in both orders flipped "
                f"({bias.share:.0%} > {bias.max_share:.0%}); its {counts['judged']} "
                "verdicts do not count"
            )
            results = [r for r in results if r.details.get("provenance") != "judged"]
            report["judge"]["reason"] = flagged
    report["summaries"] = _summaries(results, config)
    calls.flush()
    return ShadowEvidence(results, report, flagged)


def shadow_progress(
    store: ExperienceStore, scenario: str, candidate_id: str, config: GateConfig
) -> dict[str, int]:
    """How much shadow evidence ``candidate_id`` has now: its ``pairs`` and how many of
    them have a reference (``references``); the same counts as ``shadow_results``'s
    report, read without scoring or judging (what the worker compares with its last look,
    ``reef.learning.undecided``)."""
    if config.shadow is None:
        return {"pairs": 0, "references": 0}
    pairs = shadow_pairs(store, scenario, candidate_id, config.shadow.max_requests)
    return {"pairs": len(pairs), "references": _references(pairs, config)}


def _references(pairs: list[ShadowPair], config: GateConfig) -> int:
    return sum(live_reference(pair.live, config.evidence_sources) is not None for pair in pairs)


class StoredJudgeCalls:
    """The shadow judge's calls as records of purpose ``judge`` (never trained on),
    tagged ``shadow_judge: pairwise`` and with the candidate, under an idempotency key per pair,
    order and judge model: a later look at the same candidate reads the verdicts back
    instead of asking again (``test_judged_pairs_are_asked_once``)."""

    def __init__(self, store: ExperienceStore, scenario: str, candidate_id: str) -> None:
        self.store = store
        self.scenario = scenario
        self.candidate_id = candidate_id
        self.pending: list[RecordDraft] = []

    def _key(self, key: str) -> str:
        return f"shadow-judge:{self.candidate_id}:{key}"

    def reply(self, key: str) -> str | None:
        """The stored reply under ``key`` (None: never asked)."""
        record_id = self.store.find_by_idempotency_key(self.scenario, self._key(key))
        if record_id is None:
            return None
        answer = _reply(self.store.get_record(record_id))
        return None if answer is None else answer.text

    def keep(self, key: str, messages: list[dict[str, Any]], reply: str) -> None:
        """Queue the record of a call just made (written by ``flush``)."""
        tags = {"shadow_judge": "pairwise", "candidate": self.candidate_id}
        draft = model_call_draft(self.scenario, None, messages, reply, tags)
        self.pending.append(replace(draft, idempotency_key=self._key(key), session_is_new=True))

    def flush(self) -> None:
        """Write the queued records."""
        if self.pending:
            self.store.write_records(self.pending)
            self.pending = []


def _summaries(results: list[ItemResult], config: GateConfig) -> dict[str, Any]:
    """The shadow suite's means and paired interval, in all and per provenance."""
    out: dict[str, Any] = {}
    for name in ("all", "live", "judged"):
        rows = [r for r in results if name == "all" or r.details.get("provenance") == name]
        summary = summarize(
            rows,
            SHADOW_SUITE if name == "all" else f"{SHADOW_SUITE}:{name}",
            rule=config,
        )
        if summary is not None:
            out[name] = summary.as_dict()
    return out


def _score_pair(
    pair: ShadowPair,
    config: GateConfig,
    registry: ScorerRegistry,
    context: ScorerContext,
    judge: PairwiseJudge | None,
    verdicts: list[PairVerdict],
) -> tuple[str, list[ItemResult]]:
    """``(provenance, results)`` of one pair: ``live`` or ``judged``; ``void`` (no
    results) when an answer or the judge failed, ``unscored`` when nobody can score it."""
    live, shadow = _reply(pair.live), _reply(pair.shadow)
    if live is None or shadow is None:
        return "void", []
    exchange = canonical_exchange(pair.live)
    reference = live_reference(pair.live, config.evidence_sources)
    if reference is not None:
        tool_calls = isinstance(reference, dict) and "tool_calls" in reference
        item = EvalItem(
            id=pair.live.id,
            suite=SHADOW_SUITE,
            messages=exchange.messages,
            reference=reference,
            scorer={"type": "tool_call"} if tool_calls else None,
        )
        scorer = registry.build(item.scorer or config.scorer, f"{item.key}.scorer", context)
        scores = (scorer.score_reply(shadow, item).score, scorer.score_reply(live, item).score)
        return "live", _rows(item.key, pair, scores, {"provenance": "live"}, live, shadow)
    if judge is None:
        return "unscored", []
    verdict = judge.judge(pair.live.id, exchange.messages, live.text, shadow.text)
    if verdict.preferred is None:
        return "void", []
    verdicts.append(verdict)
    scores = {"shadow": (1.0, 0.0), "live": (0.0, 1.0), "tie": (0.5, 0.5)}[verdict.preferred]
    details: dict[str, Any] = {"provenance": "judged", "preferred": verdict.preferred}
    if verdict.checked:
        details["position_flipped"] = verdict.flipped
    key = f"{SHADOW_SUITE}/{pair.live.id}"
    return "judged", _rows(key, pair, scores, details, live, shadow)


def _rows(
    key: str,
    pair: ShadowPair,
    scores: tuple[float, float],
    details: dict[str, Any],
    live: Reply,
    shadow: Reply,
) -> list[ItemResult]:
    candidate, baseline = scores
    row = ItemResult(
        item_key=key,
        suite=SHADOW_SUITE,
        arm="candidate",
        repeat=0,
        score=candidate,
        output=shadow.text,
        record_id=pair.shadow.id,
        error=None,
        details=details,
        latency_ms=pair.shadow.latency_ms,
    )
    return [
        row,
        replace(
            row,
            arm="baseline",
            score=baseline,
            output=live.text,
            record_id=pair.live.id,
            latency_ms=pair.live.latency_ms,
        ),
    ]


def live_reference(record: RecordView, sources: Mapping[str, float]) -> Any:
    """The newest correction on ``record`` from feedback that counts as evidence (not
    quarantined; its source weighted above 0 in ``sources``, by name or kind); None
    without one. A tool-call correction is ``{"tool_calls": [...]}``."""
    for feedback in sorted(record.feedback, key=lambda f: f.created_at, reverse=True):
        if feedback.correction is None or feedback.quarantined:
            continue
        if source_weight(sources, feedback.source) <= 0:
            continue
        correction = feedback.correction
        if isinstance(correction, dict) and isinstance(correction.get("tool_calls"), list):
            return {"tool_calls": correction["tool_calls"]}
        return correction
    return None


def source_weight(sources: Mapping[str, float], source: str) -> float:
    """The weight ``sources`` give ``source``: by its name, else by its kind, else 0."""
    return sources.get(source, sources.get(source.split(":")[0], 0.0))


def with_shadow(decision: Decision, evidence: ShadowEvidence | None) -> Decision:
    """``decision`` with the shadow report in its evidence and, when the judge was
    flagged, the flag among its reasons."""
    if evidence is None or not evidence.report:
        return decision
    reasons = [*decision.reasons, evidence.flagged] if evidence.flagged else decision.reasons
    return replace(
        decision, reasons=reasons, evidence={**decision.evidence, "shadow": evidence.report}
    )


def _reply(record: RecordView) -> Reply | None:
    if record.status != "ok":
        return None
    try:
        reply = canonical_exchange(record).reply
    except ValueError:
        return None
    if reply is None:
        return None
    try:
        return parse_reply({"choices": [{"message": reply}]})
    except ValueError:
        return None
