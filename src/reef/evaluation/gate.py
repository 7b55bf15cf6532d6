"""The evaluation gate: evaluate a candidate against the head, decide, publish or not.

``Gate.run(candidate_id, holdout)``:

1. The candidate moves ``pending`` → ``evaluating`` (a retry finds it ``evaluating``).
2. Planted instructions in its harness reject it before any model call.
3. Items: the recipe's file suites, the scenario's holdout experience, the regression
   suites (items that admitted earlier releases) and, when the candidate adds harness
   text, leak probes. The candidate and the head answer every item (paired), through the
   gateway, pinned with ``x-reef-release``, purpose ``eval`` (never trained on). With
   ``gate.episodes``, both also play the environment's tasks, ``repeats`` episodes per
   task and side, interleaved (``episode_evidence``); an episode's score is its task's score.
4. Every answer is scored and stored (``EvaluationStore``), with the paired results of
   outside ``sources`` (shadow answers); an answer infrastructure failed is void for
   both arms; the rule (``stats.decide``) gives the verdict (passed, rejected or
   undecided: the candidate stays ``evaluating`` for the worker to decide again) with
   its reasons; the decision and its evidence go on the candidate
   (``evidence["gate"]``) and on the release when it is published.
5. Publishing: ``auto`` — compare-and-swap publish against the head it was evaluated
   against (if the head moved meanwhile, the candidate is evaluated again against the new
   head, up to ``MAX_ROUNDS`` times); ``review`` — the candidate waits ``passed`` for a
   person to promote it; ``canary`` — it serves a share of live traffic until
   ``CanaryMonitor`` promotes or abandons it. A rejected candidate changes nothing that
   serves. A candidate whose harness adds contact or personal data its parent does not
   have (a URL, an e-mail address, a phone number, …; ``safety.added_contact_data``)
   waits for review whatever the mode, with the reason in ``evidence["review"]``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from reef.core import Progress, SilentProgress
from reef.core.errors import ReefError
from reef.environments import Task, build_environment
from reef.evaluation.config import GateConfig
from reef.evaluation.decision import arm_figures, decide_results, score_answers
from reef.evaluation.episode_evidence import (
    EpisodeRun,
    as_item_results,
    collect_episodes,
    episode_jobs,
    episode_suite,
    resolve_spec,
    select_tasks,
    task_items,
)
from reef.evaluation.results import EvaluationStore
from reef.evaluation.runner import GatewayTarget, collect_answers
from reef.evaluation.safety import (
    added_contact_data,
    contact_review_reason,
    leak_probe_items,
    planted_instructions,
)
from reef.evaluation.scorers import ScorerContext, ScorerRegistry
from reef.evaluation.shadow import (
    ShadowEvidence,
    shadow_results,
    with_shadow,
    with_shadow_settings,
)
from reef.evaluation.stats import spent_confidence
from reef.evaluation.suites import is_current_suite, load_suite, regression_suites
from reef.evaluation.values import (
    INSUFFICIENT_EVIDENCE,
    TRANSIENT_ERROR_KINDS,
    VOID_ERROR_KINDS,
    Answer,
    Decision,
    EvalItem,
    EvidenceNotes,
    ItemResult,
    item_label,
    with_notes,
)
from reef.experience import ExperienceStore, LearningBudgetExhaustedError, RecordNotFoundError
from reef.harness import Harness
from reef.harness.packing import read_bundle_archive
from reef.releases import (
    ArtifactStore,
    Candidate,
    Release,
    ReleaseChain,
    ReleaseConflictError,
    ScenarioHasNoReleaseError,
)

log = logging.getLogger("reef.gate")

PublishMode = Literal["auto", "review", "canary"]
GATE_ACTOR = "gate"
MAX_ROUNDS = 3


@dataclass(frozen=True)
class GateOutcome:
    """What the gate did with one candidate. ``action``: ``published``, ``awaiting
    review``, ``canary``, ``rejected``, ``undecided`` (it stays ``evaluating``; the
    worker decides again when evidence arrives) or ``skipped`` (the candidate was not
    waiting for the gate)."""

    candidate_id: str
    action: str
    decision: Decision | None
    evaluation_id: str | None = None
    release_id: str | None = None
    cost: dict[str, Any] = field(default_factory=dict)
    review_reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (stored as a job's result)."""
        out: dict[str, Any] = {
            "candidate_id": self.candidate_id,
            "action": self.action,
            "decision": None if self.decision is None else self.decision.summary(),
            "evaluation_id": self.evaluation_id,
            "release_id": self.release_id,
            "cost": self.cost,
        }
        if self.review_reason is not None:
            out["review_reason"] = self.review_reason
        if self.decision is not None and self.decision.undecided:
            out["missing"] = self.decision.missing
        return out


class EvidenceSource(Protocol):
    """Paired results gathered outside the gate's own calls (shadow answers on live
    traffic): their items (a current suite such as ``shadow``, with their provenance)
    and their scored results for ``candidate_id`` against ``baseline_id``. The gate
    stores and weighs them (``gate.evidence_weights``) with its own."""

    def paired(
        self, candidate_id: str, baseline_id: str
    ) -> tuple[list[EvalItem], list[ItemResult]]:
        """The items and both arms' results gathered so far."""
        ...


@dataclass
class Gate:
    """The gate of one scenario's recipe. ``suite_dir`` resolves relative suite paths
    (the recipe's directory); ``progress`` hears how far the evaluation got."""

    config: GateConfig
    publish: PublishMode
    chain: ReleaseChain
    artifacts: ArtifactStore
    evaluations: EvaluationStore
    target: GatewayTarget
    scorer_context: ScorerContext = field(default_factory=ScorerContext)
    scorers: ScorerRegistry = field(default_factory=ScorerRegistry)
    suite_dir: Path = Path(".")
    progress: Progress = field(default_factory=SilentProgress)
    # Where shadow records are read (``gate.shadow``; None: no shadow suite).
    shadow_store: ExperienceStore | None = None
    sources: Sequence[EvidenceSource] = ()

    def run(
        self,
        candidate_id: str,
        holdout: Sequence[EvalItem] = (),
        notes: EvidenceNotes | None = None,
        now: datetime | None = None,
    ) -> GateOutcome:
        """Evaluate, decide and publish per the mode (module docstring); ``notes`` (what
        the held-out selection dropped, what training overlapped with the suites) go into
        the decision. ``now`` (default: the wall clock) times an undecided candidate's
        wait against ``max_wait_hours``."""
        now = now or datetime.now(UTC)
        candidate = self.chain.get_candidate(candidate_id)
        if candidate.state == "pending":
            meter = self.target.meter  # its recipe budgets cap the shadow calls too
            budgets = () if meter is None else meter.budgets
            evidence = with_shadow_settings(candidate.evidence, self.config.shadow, budgets)
            candidate = self.chain.set_candidate_state(candidate_id, "evaluating", evidence)
        elif candidate.state != "evaluating":
            return GateOutcome(candidate_id, "skipped", None, cost={"state": candidate.state})
        for _ in range(MAX_ROUNDS):
            baseline = self.chain.head(candidate.scenario)
            if baseline is None:
                raise ScenarioHasNoReleaseError(candidate.scenario)
            rule = self._rule(candidate)
            try:
                decision, evaluation_id, cost = self._evaluate(
                    candidate, baseline, holdout, notes, rule
                )
            except LearningBudgetExhaustedError as error:
                return self._out_of_budget(candidate, baseline, error, now)
            previous = (candidate.evidence or {}).get("gate") or {}
            decision = self._limit(decision, previous, now)
            evidence = {
                **(candidate.evidence or {}),
                "gate": {
                    "evaluation_id": evaluation_id,
                    "baseline_id": baseline.id,
                    "publish": self.publish,
                    "decision": decision.as_dict(),
                    "cost": cost,
                    "history": [*previous.get("history", []), _look(decision, evaluation_id, now)],
                },
            }
            if decision.undecided:
                self.chain.set_candidate_state(candidate_id, "evaluating", evidence)
                log.info("candidate %s undecided: %s", candidate_id, "; ".join(decision.reasons))
                return GateOutcome(candidate_id, "undecided", decision, evaluation_id, cost=cost)
            if not decision.passed:
                self.chain.set_candidate_state(candidate_id, "rejected", evidence)
                # The reasons alone: the summary opens with the verdict said here already.
                log.info("candidate %s rejected: %s", candidate_id, "; ".join(decision.reasons))
                return GateOutcome(candidate_id, "rejected", decision, evaluation_id, cost=cost)
            outcome = self._pass(candidate, baseline, decision, evidence, evaluation_id, cost)
            if outcome is not None:
                return outcome
            candidate = self.chain.get_candidate(candidate_id)
        self.chain.set_candidate_state(candidate_id, "abandoned")
        return GateOutcome(candidate_id, "abandoned", None, cost={"reason": "head kept moving"})

    def _out_of_budget(
        self,
        candidate: Candidate,
        baseline: Release,
        error: LearningBudgetExhaustedError,
        now: datetime,
    ) -> GateOutcome:
        """Undecided, never published: a learning budget ran out mid-evaluation. The
        candidate stays ``evaluating`` (the worker decides again, in a later window)."""
        reason = f"undecided: {error.message}"
        decision = Decision("undecided", [reason], {}, None, [], missing=[error.message])
        previous = (candidate.evidence or {}).get("gate") or {}
        cost = {"budget_exhausted": error.budget, **self._spend()}
        gate = {
            "evaluation_id": None,
            "baseline_id": baseline.id,
            "publish": self.publish,
            "decision": decision.as_dict(),
            "cost": cost,
            "history": [
                *previous.get("history", []),
                {**_look(decision, "", now), "budget_resets": error.resets.isoformat()},
            ],
        }
        evidence = {**(candidate.evidence or {}), "gate": gate}
        self.chain.set_candidate_state(candidate.id, "evaluating", evidence)
        log.info("candidate %s undecided: %s", candidate.id, error.message)
        return GateOutcome(candidate.id, "undecided", decision, cost=cost)

    def _spend(self) -> dict[str, Any]:
        """The learning spend of this gate's calls so far (``target.meter``)."""
        meter = self.target.meter
        return {} if meter is None else {"spend": meter.tally.as_dict()}

    # -- deciding ------------------------------------------------------------------------

    def _rule(self, candidate: Candidate) -> GateConfig:
        """The rule for ``candidate``: the configured one, or under ``alpha_spending:
        scenario`` (sequential) with the alpha of its place among the scenario's gated
        candidates (``stats.spent_confidence``)."""
        if self.config.method != "sequential" or self.config.alpha_spending != "scenario":
            return self.config
        earlier = [
            c
            for c in self.chain.candidates(candidate.scenario, limit=1000)
            if (c.created_at, c.id) < (candidate.created_at, candidate.id)
            and (c.evidence or {}).get("gate")
        ]
        confidence = spent_confidence(self.config.confidence, len(earlier) + 1)
        return self.config.model_copy(update={"confidence": confidence})

    def evidence_grows(self) -> bool:
        """Whether a later look can see more evidence than this one: new held-out
        traffic (``gate.holdout``) or an outside source (``sources``: shadow results).
        Void items are asked again on a later look whatever this says."""
        shadow = self.shadow_store is not None and self.config.shadow is not None
        return self.config.holdout or bool(self.sources) or shadow

    def _limit(self, decision: Decision, previous: Mapping[str, Any], now: datetime) -> Decision:
        """An undecided ``decision`` becomes a rejection for insufficient evidence past
        ``max_evidence`` items, when no more evidence can arrive (``evidence_grows``,
        and no void item to ask again), or past ``max_wait_hours`` since the
        candidate's first look."""
        if not decision.undecided:
            return decision
        items = 0 if decision.overall is None else decision.overall.items
        history = previous.get("history") or []
        first = datetime.fromisoformat(history[0]["at"]) if history else now
        waited = (now - first).total_seconds() / 3600.0
        if items >= self.config.max_evidence:
            why = f"{items} paired items reached max_evidence {self.config.max_evidence}"
        elif not self.evidence_grows() and not decision.voids.get("void"):
            why = "no more evidence can arrive (gate.holdout is off)"
        elif waited >= self.config.max_wait_hours:
            why = f"undecided for {waited:.1f} h, max_wait_hours {self.config.max_wait_hours:g}"
        else:
            return decision
        reasons = [f"{INSUFFICIENT_EVIDENCE} {why}; still undecided: {'; '.join(decision.reasons)}"]
        return replace(decision, verdict="rejected", reasons=reasons, missing=[])

    def _evaluate(
        self,
        candidate: Candidate,
        baseline: Release,
        holdout: Sequence[EvalItem],
        notes: EvidenceNotes | None = None,
        rule: GateConfig | None = None,
    ) -> tuple[Decision, str, dict[str, Any]]:
        started = time.monotonic()
        mine, parent = (
            self._harness(candidate.manifest.harness),
            self._harness(baseline.manifest.harness),
        )
        planted = planted_instructions(mine, parent) if self.config.safety.scan_harness else []
        items = self._items(candidate.scenario, holdout)
        spec, tasks = self._tasks()
        episode_items = [] if spec is None else task_items(episode_suite(spec["type"]), tasks)
        probes = (
            leak_probe_items(mine, parent, self.config.safety.leak_min_chars)
            if self.config.safety.leak_probes and not planted
            else []
        )
        gathered = [source.paired(candidate.id, baseline.id) for source in self.sources]
        outside = [item for found, _ in gathered for item in found]
        meta = {
            "suites": sorted({item.suite for item in [*items, *outside]}),
            "items": len(items),
            "probes": len(probes),
            "repeats": self.config.repeats,
            "publish": self.publish,
            "gateway": self.target.base_url,
        }
        if self.config.episodes is not None and spec is not None:
            meta["episodes"] = {
                "environment": spec["type"],
                "tasks": len(tasks),
                "repeats": self.config.episodes.repeats,
            }
        asked = [*items, *episode_items, *probes, *outside]
        evaluation_id = self.evaluations.start(
            candidate.scenario, candidate.id, baseline.id, asked, meta, GATE_ACTOR
        )
        try:
            answers: list[Answer] = []
            runs: list[EpisodeRun] = []
            if not planted:
                answers = self._answers(items, probes, candidate, baseline)
                runs = self._episodes(spec, tasks, candidate, baseline)
                # Void failures (outages) are not errors of the evaluation: the decision
                # counts them and is undecided past max_void_fraction.
                check_errors(answers, self.config.max_error_fraction, runs, VOID_ERROR_KINDS)
            results = [*self._score(items, probes, answers), *as_item_results(runs)]
            results += [result for _, found in gathered for result in found]
            shadow = self._shadow(candidate)
            results += shadow.results
            self.evaluations.add_results(evaluation_id, results)
            self.evaluations.add_episodes(evaluation_id, runs)
            decision = decide_results(
                results, planted, rule or self.config, [*items, *episode_items, *outside]
            )
            decision = with_shadow(with_notes(decision, notes), shadow)
            if (rule or self.config).non_inferiority_margin is not None:
                decision = replace(decision, arms=self._priced_arms(results))
        except Exception as error:
            self.evaluations.fail(evaluation_id, repr(error))
            raise
        cost = {
            "model_calls": sum(answer.attempts for answer in answers)
            + sum(run.result.turns for run in runs if run.result is not None),
            "seconds": round(time.monotonic() - started, 3),
            "items": len(items) + len(episode_items),
        }
        if runs:
            cost["episodes"] = len(runs)
        cost.update(self._spend())
        self.evaluations.finish(evaluation_id, decision, {**meta, "cost": cost})
        return decision, evaluation_id, cost

    def _priced_arms(self, results: Sequence[ItemResult]) -> dict[str, Any]:
        """Each arm's answers with their cost, read from their records (the gateway's
        eval records carry the cost of whoever answered; ``arm_figures``); latency only
        without a store."""
        current = sorted({r.suite for r in results if is_current_suite(r.suite)})
        store = self.shadow_store
        if store is None:
            return arm_figures(results, current)
        costs: dict[str, float | None] = {}
        for result in results:
            record_id = result.record_id
            if record_id is not None and record_id not in costs:
                try:
                    costs[record_id] = store.get_record(record_id).cost
                except RecordNotFoundError:
                    costs[record_id] = None
        return arm_figures(results, current, costs)

    def _shadow(self, candidate: Candidate) -> ShadowEvidence:
        """The shadow suite so far (``evaluation.shadow``); empty without a store."""
        if self.shadow_store is None or self.config.shadow is None:
            return ShadowEvidence()
        return shadow_results(
            self.shadow_store,
            candidate.scenario,
            candidate.id,
            self.config,
            self.scorers,
            self.scorer_context,
        )

    def _harness(self, digest: str | None) -> Harness | None:
        if digest is None:
            return None
        return read_bundle_archive(self.artifacts.read_bytes(digest)).harness

    def _items(self, scenario: str, holdout: Sequence[EvalItem]) -> list[EvalItem]:
        items: list[EvalItem] = []
        for path in self.config.suites:
            items.extend(load_suite((self.suite_dir / path).resolve()))
        if self.config.holdout:
            items.extend(list(holdout)[: self.config.holdout_limit])
        if self.config.regression_releases:
            releases = self.chain.releases(scenario, limit=200)
            items.extend(
                regression_suites(self.evaluations, releases, self.config.regression_releases)
            )
        return items

    def _tasks(self) -> tuple[dict[str, Any] | None, list[Task]]:
        """The episodes' environment spec (None without ``gate.episodes``) and tasks."""
        episodes = self.config.episodes
        if episodes is None:
            return None, []
        spec = resolve_spec(episodes, self.suite_dir)
        environment = build_environment(spec, where="gate.episodes.environment")
        return spec, select_tasks(environment, episodes)

    def _episodes(
        self,
        spec: dict[str, Any] | None,
        tasks: list[Task],
        candidate: Candidate,
        baseline: Release,
    ) -> list[EpisodeRun]:
        if spec is None or self.config.episodes is None or not tasks:
            return []
        jobs = episode_jobs(
            tasks,
            {"candidate": candidate.id, "baseline": baseline.id},
            self.config.episodes.repeats,
        )
        params = {"max_tokens": self.config.max_tokens, "temperature": self.config.temperature}
        return collect_episodes(
            self.target,
            spec,
            jobs,
            params,
            lambda done, total: self.progress.report(
                done / total, f"evaluating: {done}/{total} episodes"
            ),
        )

    def _answers(
        self,
        items: list[EvalItem],
        probes: list[EvalItem],
        candidate: Candidate,
        baseline: Release,
    ) -> list[Answer]:
        total = max(len(items) * self.config.repeats * 2 + len(probes), 1)
        defaults = {"max_tokens": self.config.max_tokens, "temperature": self.config.temperature}

        def report(offset: int) -> Callable[[int, int], None]:
            return lambda done, _total: self.progress.report(
                (offset + done) / total, f"evaluating: {offset + done}/{total} answers"
            )

        answers = collect_answers(
            self.target,
            items,
            {"candidate": candidate.id, "baseline": baseline.id},
            repeats=self.config.repeats,
            defaults=defaults,
            progress=report(0),
        )
        if probes:
            answers += collect_answers(
                self.target,
                probes,
                {"candidate": candidate.id},
                defaults=defaults,
                progress=report(len(answers)),
            )
        return answers

    def _score(
        self, items: list[EvalItem], probes: list[EvalItem], answers: list[Answer]
    ) -> list[ItemResult]:
        return score_answers(
            [*items, *probes],
            answers,
            self.config.scorer,
            self.scorers,
            self.scorer_context,
            self.config.safety.leak_min_chars,
        )

    # -- publishing ----------------------------------------------------------------------

    def _pass(
        self,
        candidate: Candidate,
        baseline: Release,
        decision: Decision,
        evidence: dict[str, Any],
        evaluation_id: str,
        cost: dict[str, Any],
    ) -> GateOutcome | None:
        """Publish per the mode; None when the head moved and the caller must re-run. A
        candidate that adds contact data waits for review whatever the mode."""
        review = self._contact_review(candidate, baseline)
        if review is not None:
            gate = {**evidence["gate"], "publish": "review", "requested_publish": self.publish}
            evidence = {**evidence, "gate": gate, "review": review}
        self.chain.set_candidate_state(candidate.id, "passed", evidence)
        reason = decision.summary()
        if self.publish == "review" or review is not None:
            log.info("candidate %s awaits review", candidate.id)
            return GateOutcome(
                candidate.id,
                "awaiting review",
                decision,
                evaluation_id,
                cost=cost,
                review_reason=None if review is None else review["reason"],
            )
        if self.publish == "canary":
            canary = self.config.canary
            self.chain.start_canary(
                candidate.id,
                canary.fraction,
                GATE_ACTOR,
                reason,
                {"min_requests": canary.min_requests, "max_hours": canary.max_hours},
            )
            return GateOutcome(candidate.id, "canary", decision, evaluation_id, cost=cost)
        try:
            release = self.chain.publish(
                candidate.id, baseline.id, GATE_ACTOR, reason, evidence=evidence
            )
        except ReleaseConflictError:
            log.info("head of %s moved during evaluation; evaluating again", candidate.scenario)
            self.chain.set_candidate_state(candidate.id, "evaluating")
            return None
        log.info("candidate %s published as release %s", candidate.id, release.id)
        return GateOutcome(
            candidate.id, "published", decision, evaluation_id, release.id, cost=cost
        )

    def _contact_review(self, candidate: Candidate, baseline: Release) -> dict[str, Any] | None:
        """Why the candidate must wait for a person: the contact data its harness adds to
        the head's (``evidence["review"]``); None when it adds none."""
        added = added_contact_data(
            self._harness(candidate.manifest.harness), self._harness(baseline.manifest.harness)
        )
        if not added:
            return None
        return {
            "reason": contact_review_reason(added),
            "rule": "contact_data",
            "findings": added,
            "requested_publish": self.publish,
        }


class EvaluationFailedError(ReefError):
    """Too many eval calls or episodes failed to decide anything. ``transient``: every
    failure was of a kind a later try may not meet (``TRANSIENT_ERROR_KINDS``: 429, 5xx,
    timeouts, no connection), so the job may be retried; otherwise the same items would
    fail again (a refused item is refused again) and the job fails at once. ``kinds``
    counts the failures by kind (``ErrorKind``, ``environment`` or ``other``)."""

    def __init__(
        self, message: str, *, transient: bool, kinds: Mapping[str, int] | None = None
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.kinds = dict(kinds or {})


def _look(decision: Decision, evaluation_id: str, now: datetime) -> dict[str, Any]:
    """One line of a candidate's verdict history: when, what, on how much evidence (with
    ``gate.shadow``, the shadow pairs read and how many had a reference: the worker
    looks again when either grows)."""
    look: dict[str, Any] = {
        "at": now.isoformat(),
        "evaluation_id": evaluation_id,
        "verdict": decision.verdict,
        "items": 0 if decision.overall is None else decision.overall.items,
        "suites": decision.voids.get("suites", {}),
        "void": decision.voids.get("void", 0),
        "gain": None if decision.overall is None else decision.overall.difference.mean,
        "low": None if decision.overall is None else decision.overall.difference.low,
    }
    shadow = decision.evidence.get("shadow")
    if isinstance(shadow, dict):
        look["shadow"] = {key: int(shadow.get(key, 0)) for key in ("pairs", "references")}
    return look


def check_errors(
    answers: Sequence[Answer],
    max_fraction: float,
    runs: Sequence[EpisodeRun] = (),
    void_kinds: Collection[str] = (),
) -> None:
    """Raise ``EvaluationFailedError`` when more than ``max_fraction`` of either arm's
    answers never came, or of its episodes failed (stop ``error``: the model calls
    failed; or the environment could not play them): a gateway or upstream outage is
    not evidence against a candidate. Answers and episodes are counted apart.

    The message counts the failures by kind and names the first failing item (its key:
    suite and id, for a held-out item the record id) and its error, e.g. ``20 of 72
    candidate calls failed (more than 10%): refused 20; first: item rec_1 (holdout):
    gateway answered 400: …``. An episode that failed otherwise than in a model call
    (its environment) counts as ``environment``, one whose error names no kind as
    ``other``; either makes the failure not transient. Failures of ``void_kinds`` are
    not counted (the gate counts them as void items instead)."""
    for arm in ("candidate", "baseline"):
        mine = [answer for answer in answers if answer.arm == arm]
        failed = [
            (a.item_key, a.error, a.error_kind)
            for a in mine
            if a.text is None and a.error_kind not in void_kinds
        ]
        if mine and len(failed) > max_fraction * len(mine):
            raise _failed(f"{arm} calls", len(mine), failed, max_fraction)
        played = [run for run in runs if run.arm == arm]
        broken = [
            (
                r.item_key,
                r.error_text,
                r.error_kind or ("environment" if r.result is None else None),
            )
            for r in played
            if r.failed
            and (r.error_kind or ("environment" if r.result is None else None)) not in void_kinds
        ]
        if played and len(broken) > max_fraction * len(played):
            raise _failed(f"{arm} episodes", len(played), broken, max_fraction)


def _failed(
    what: str,
    total: int,
    failed: Sequence[tuple[str, str | None, str | None]],
    max_fraction: float,
) -> EvaluationFailedError:
    kinds = Counter(kind or "other" for _, _, kind in failed)
    counts = ", ".join(f"{kind} {n}" for kind, n in kinds.most_common())
    key, error, _ = failed[0]
    return EvaluationFailedError(
        f"{len(failed)} of {total} {what} failed (more than {max_fraction:.0%}): {counts}; "
        f"first: {item_label(key)}: {error}",
        transient=all(kind in TRANSIENT_ERROR_KINDS for kind in kinds),
        kinds=kinds,
    )
