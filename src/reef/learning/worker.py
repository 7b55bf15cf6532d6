"""``Worker``: turns triggers into jobs and jobs into candidates.

One pass (``run_once``) does two things:

1. Computed feedback (``reef.learning.computed``): for every scenario whose recipe
   enables ``signals``, the conversation signals of sessions that grew since the last
   pass are written as feedback (``source: signal:<name>``). Then triggers: for every
   scenario with a recipe and no queued or running job, the recipe's triggers are
   checked (``min_new_feedback``: feedback since the scenario's last job, computed
   feedback included; ``max_interval_seconds``: time since the last job, or no job yet)
   and a job is enqueued when any fires.
2. Jobs: while fewer than ``max_concurrent`` run, claim one (with a lease) and run it in a
   thread that heartbeats the lease.
3. Undecided candidates with new evidence are decided again (``reef.learning.undecided``),
   then live canaries.

Time (leases, the interval trigger, a canary's ``max_hours``) is the job queue's clock,
so a test hands the worker a queue with a clock it moves.

Running a job (``JobRun``): select
experience as of the job's creation (so a retry sees the same snapshot), run the recipe's
learners in order (each sees the head with the earlier learners' components in it), and
propose ONE candidate: the head's manifest with the adapter and/or harness replaced.
Before its gate, a candidate whose model a learner trained answers a sample of that
learner's training prompts through the gateway; served far below what the trainer
measured, the job fails with ``train/serve skew`` (``reef.learning.skew``).

Exactly one candidate per job, however often it is retried: candidates are proposed with
``created_by = "job:<job id>"``; before proposing, the worker renews its lease (proving it
still owns the job) and looks for a candidate of that job, reusing it when found; the id
is then stored on the job. A worker that lost its lease stops at its next heartbeat,
progress report or write. (Residual window: a worker frozen for a whole lease between its
renewal and its propose; see docs/learning.md.)

Failures: an attempt that raised is retried only when its cause can pass (an outage);
one that will recur (a refused eval call, a validation error) fails the job at once
(``reef.learning.retries``), its message stored as the job's error.

Asynchrony: if the head moved while the job ran, ``on_stale: drop`` ends the job
``succeeded`` with outcome ``dropped`` and proposes nothing; ``evaluate`` proposes with
parent = the head it trained from, and the gate compares against the new head.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from reef.config import ReefSettings
from reef.core import new_id
from reef.core.errors import InvalidInputError
from reef.evaluation import (
    CanaryMonitor,
    CanaryOutcome,
    EvaluationStore,
    GateOutcome,
    TeacherChecks,
)
from reef.experience import (
    ExperienceStore,
    LearningBudgetExhaustedError,
    LearningMeter,
    Redactor,
    StoreUnavailableError,
)
from reef.jobs import Job, JobCancelledError, JobQueue, LeaseLostError
from reef.learning.base import (
    ExperienceBatch,
    Learner,
    LearnerConfig,
    LearnerContext,
    LearnerOutput,
    MetricLog,
    ProbedPrompt,
)
from reef.learning.computed import SignalPass, SignalWriter
from reef.learning.holdout import (
    build_gate,
    evidence_notes,
    gate_target,
    overlap_summary,
    select_holdout,
    suite_prompts,
    trusted_references,
)
from reef.learning.judges import JudgePass, JudgeWriter
from reef.learning.learners import NoCandidateError
from reef.learning.live_references import CheckPass, LiveReferenceWriter
from reef.learning.recipe_files import RecipeFiles
from reef.learning.recipes import Recipe, RecipeError, parse_recipe
from reef.learning.reflect import UpstreamModels, UpstreamReflector
from reef.learning.registry import LearnerRegistry
from reef.learning.retries import UNKNOWN_REASON, failure_message, retry_verdict
from reef.learning.selection import select_experience
from reef.learning.skew import TrainServeSkewError, check_skew
from reef.learning.teacher import ReleaseManifests
from reef.learning.trainers import TrainingDeadlineError
from reef.learning.undecided import Resumption, resume_undecided
from reef.releases import (
    ArtifactStore,
    Candidate,
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
)

if TYPE_CHECKING:
    from reef.telemetry.live import LiveExport

log = logging.getLogger("reef.worker")

JOB_KIND = "learn"
PROGRESS_MIN_INTERVAL_SECONDS = 0.5


def send_gate_result(live: LiveExport, scenario: str, outcome: GateOutcome) -> None:
    """Send a gate evaluation that reached a decision as a ``gen_ai.evaluation.result``
    event: the verdict as its label, the candidate's overall mean as its score."""
    decision = outcome.decision
    if decision is None or outcome.evaluation_id is None:
        return  # skipped: no evaluation ran
    overall = decision.overall
    live.gate(
        scenario,
        outcome.candidate_id,
        outcome.evaluation_id,
        decision.verdict,
        overall.candidate_mean if overall is not None else None,
    )


def job_actor(job_id: str) -> str:
    """The ``created_by`` of the candidate a job proposes (how a retry finds it)."""
    return f"job:{job_id}"


# How a finished job's log line names what the gate did with its candidate.
_GATE_ACTIONS = {
    "published": "published",
    "rejected": "rejected by the gate",
    "review": "held for review",
    "canary": "serving as a canary",
    "abandoned": "abandoned (the head kept moving)",
    "skipped": "not gated (no longer waiting for it)",
    "undecided": "undecided (waiting for more evidence)",
    "pending": "proposed",
}


def outcome_summary(result: dict[str, Any]) -> str:
    """What a finished job's log line says came of it: for a gated candidate, what the
    gate did (``candidate … rejected by the gate``), never just ``proposed``; else the
    outcome, with its reason when it has one."""
    outcome = str(result.get("outcome"))
    gate = result.get("gate")
    if outcome == "proposed" and isinstance(gate, dict):
        action = str(gate.get("action"))
        line = f"candidate {result.get('candidate_id')} {_GATE_ACTIONS.get(action, action)}"
        reason = gate.get("reason")
        return f"{line} ({reason})" if reason else line
    reason = result.get("reason")
    return f"{outcome}: {reason}" if reason else outcome


def default_owner() -> str:
    """A worker name unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()[-8:]}"


class Worker:
    """Claims learning jobs and runs them, up to ``max_concurrent`` at once.

    ``registry`` overrides the learner registry (default: ``reef.learners`` entry
    points); ``recipes`` overrides the recipes read from ``scenarios.<s>.recipe``;
    ``upstream_base_urls`` gives base URLs by upstream name for ``reflect`` (the
    ``local`` upstream has none in the config). The stores — experience, the release
    chain, ``queue`` (the job queue, whose clock the worker's time comes from) and
    ``evaluations`` (where the gate keeps its evaluations) — are built by the composition
    root on one database. ``redactor`` (the configured ``capture.redact_patterns``;
    default: none) scrubs what the judges write; the signals' text is copied from
    records the gateway already redacted.
    """

    def __init__(  # noqa: PLR0913
        self,
        settings: ReefSettings,
        store: ExperienceStore,
        chain: ReleaseChain,
        artifacts: ArtifactStore,
        *,
        queue: JobQueue,
        evaluations: EvaluationStore,
        owner: str | None = None,
        max_concurrent: int = 1,
        lease_seconds: float = 60.0,
        poll_seconds: float = 1.0,
        registry: LearnerRegistry | None = None,
        recipes: Mapping[str, Recipe] | None = None,
        upstream_base_urls: Mapping[str, str] | None = None,
        redactor: Redactor | None = None,
        live_export: LiveExport | None = None,
    ) -> None:
        if max_concurrent < 1:
            raise InvalidInputError("max_concurrent must be at least 1")
        self.settings = settings
        self.store = store
        self.chain = chain
        self.artifacts = artifacts
        self.owner = owner or default_owner()
        self.max_concurrent = max_concurrent
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.registry = registry or LearnerRegistry()
        self.queue = queue
        self.evaluations = evaluations
        self.upstream_base_urls = dict(upstream_base_urls or {})
        self._recipes = dict(recipes) if recipes is not None else None
        self.recipe_files = RecipeFiles(settings, self.registry)
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self.signals = SignalWriter(store, settings.trust_of, redactor)
        self.judges = JudgeWriter(store, redactor)
        self.teacher_checks = LiveReferenceWriter(
            settings, store, chain, self.upstream_base_urls, redactor
        )
        # Gate results go out as gen_ai.evaluation.result events (``otel.enabled``).
        self.live_export = live_export

    # -- recipes and triggers ------------------------------------------------------------

    def recipes(self) -> dict[str, Recipe]:
        """Every scenario's recipe: the override, else each configured recipe file that
        loads, read again on every call (one that fails is left out, its scenario does
        not learn, and the failure is logged once per change: ``RecipeFiles``)."""
        if self._recipes is not None:
            return dict(self._recipes)
        return self.recipe_files.load_all()

    def recipe_of(self, scenario: str) -> Recipe | None:
        """The scenario's recipe (None: it names none); raises ``RecipeError`` with the
        reason when its file cannot be used."""
        if self._recipes is not None:
            return self._recipes.get(scenario)
        return self.recipe_files.load(scenario)

    def models_for(self, scenario: str, meter: LearningMeter | None = None) -> UpstreamModels:
        """The configured models of ``scenario`` (judges, the signals' extractor), with
        the worker's base URLs for upstreams that have none in the config; with
        ``meter``, their calls count against the learning budgets as ``judge``."""
        return UpstreamModels(self.settings, scenario, self.upstream_base_urls, meter=meter)

    def meter_for(self, scenario: str, recipe: Recipe | None) -> LearningMeter:
        """A fresh tally of Reef's own spend for ``scenario``, enforcing its
        ``learning_budget`` and the recipe's (``reef.experience.learning_spend``) on the
        store's ledger, in the job queue's time."""
        budgets = [(f"scenario:{scenario}", self.settings.scenario(scenario).learning_budget)]
        if recipe is not None:
            budgets.append((f"recipe:{recipe.name or scenario}", recipe.learning_budget))
        database = getattr(self.store, "database", None)
        return LearningMeter(database, budgets, self.queue.now, scenario=scenario)

    def compute_feedback(self) -> dict[str, list[SignalPass | JudgePass]]:
        """Write the conversation signals and the judges' grades of every scenario whose
        recipe asks for them (``reef.learning.computed``, ``reef.learning.judges``);
        what each pass did."""
        done: dict[str, list[SignalPass | JudgePass]] = {}
        now = self.queue.now()
        for scenario, recipe in self.recipes().items():
            passes: list[SignalPass | JudgePass] = []
            models = self.models_for(scenario, self.meter_for(scenario, recipe))
            if recipe.signals.enabled:
                passes.append(self.signals.run(scenario, recipe.signals, now, models))
            passes += [self.judges.run(scenario, judge, models, now) for judge in recipe.judges]
            if passes:
                done[scenario] = passes
        return done

    def check_teachers(self) -> dict[str, CheckPass]:
        """Ask the teacher of every distilled scenario's live routed canary about the
        student's checked answers (``reef.learning.live_references``); what each pass
        did. Runs before the canaries are decided, in the same worker pass."""
        done: dict[str, CheckPass] = {}
        now = self.queue.now()
        for scenario, config in self.settings.scenarios.items():
            checks = None if config.distill is None else config.distill.live_references
            if checks is None or max(checks.fraction, checks.on_policy_fraction) <= 0:
                continue
            try:
                recipe = self.recipe_of(scenario)
            except RecipeError as error:
                log.warning("teacher checks of %r use the default scorer: %s", scenario, error)
                recipe = None
            meter = self.meter_for(scenario, recipe)
            done[scenario] = self.teacher_checks.run(
                scenario,
                checks,
                None if recipe is None else recipe.gate,
                meter,
                now,
                self.models_for(scenario, meter),
            )
        return done

    def check_triggers(self) -> list[Job]:
        """Enqueue a job for every scenario whose recipe's trigger fires (computed
        feedback written first, so it counts toward ``min_new_feedback``); the jobs."""
        self.compute_feedback()
        now = self.queue.now()
        enqueued = []
        for scenario, recipe in self.recipes().items():
            last = self.queue.last_job(scenario)
            if last is not None and last.state in ("queued", "running"):
                continue
            reason = self._fired(scenario, recipe, last, now)
            if reason is not None:
                job = self.queue.enqueue(scenario, JOB_KIND, {"trigger": reason})
                log.info("trigger %s fired for %r: job %s", reason, scenario, job.id)
                enqueued.append(job)
        return enqueued

    def _fired(self, scenario: str, recipe: Recipe, last: Job | None, now: datetime) -> str | None:
        since = None if last is None else last.created_at
        for trigger in recipe.triggers():
            if trigger.type == "min_new_feedback":
                if self.store.new_feedback_count(scenario, since) >= trigger.count:
                    return trigger.type
            elif trigger.type == "max_interval_seconds" and (
                since is None or (now - since).total_seconds() >= trigger.seconds
            ):
                return trigger.type
        return None

    # -- the loop ------------------------------------------------------------------------

    def run_once(self) -> list[Job]:
        """One pass: check triggers, claim what fits, run it, and wait for every job this
        worker is running; then decide live canaries. Returns the jobs it claimed, as
        they ended."""
        self.check_triggers()
        claimed = self._claim_available()
        self.wait()
        self.resume_undecided()
        self.check_teachers()
        self.check_canaries()
        return [self.queue.get(job.id) for job in claimed]

    def resume_undecided(self) -> list[Resumption]:
        """Decide again the undecided candidates with new evidence
        (``reef.learning.undecided``)."""
        return resume_undecided(self)

    def check_canaries(self) -> list[CanaryOutcome]:
        """Promote or abandon the live canaries whose evidence is in (``CanaryMonitor``)."""
        steps = {
            name: config.distill.rollout_steps
            for name, config in self.settings.scenarios.items()
            if config.distill is not None
        }
        checks = {
            name: TeacherChecks.of(
                config.distill.live_references.fraction,
                self.settings.upstreams[config.distill.teacher.upstream].type,
            )
            for name, config in self.settings.scenarios.items()
            if config.distill is not None
        }
        monitor = CanaryMonitor(self.chain, self.store, rollout_steps=steps, teacher_checks=checks)
        outcomes = monitor.check(now=self.queue.now())
        for outcome in outcomes:
            if outcome.action != "waiting":
                log.info("canary of %r: %s", outcome.scenario, outcome.reason)
        return outcomes

    def run_forever(self, stop_event: threading.Event) -> None:
        """Loop until ``stop_event`` is set; then wait for running jobs (their leases are
        kept until they end). Database outages are logged and retried."""
        log.info("worker %s started (max %d concurrent jobs)", self.owner, self.max_concurrent)
        while not stop_event.is_set():
            try:
                self.check_triggers()
                self._claim_available()
                self.resume_undecided()
                self.check_teachers()
                self.check_canaries()
            except (StoreUnavailableError, RecipeError) as error:
                log.warning("worker pass failed: %s", error)
            stop_event.wait(self.poll_seconds)
        self.wait()
        log.info("worker %s stopped", self.owner)

    def wait(self) -> None:
        """Block until every job this worker runs has ended."""
        while True:
            with self._lock:
                threads = list(self._threads.values())
            if not threads:
                return
            for thread in threads:
                thread.join()

    def _claim_available(self) -> list[Job]:
        claimed = []
        while True:
            with self._lock:
                if len(self._threads) >= self.max_concurrent:
                    break
            job = self.queue.claim(self.owner, self.lease_seconds)
            if job is None:
                break
            log.info("claimed job %s of %r (attempt %d)", job.id, job.scenario, job.attempt)
            thread = threading.Thread(
                target=self._run_claimed, args=(job,), name=f"reef-job-{job.id}", daemon=True
            )
            # Registered and started under the lock, so ``wait`` never sees a thread that
            # is not started yet (joining one raises); the thread takes the lock only
            # when it ends.
            with self._lock:
                self._threads[job.id] = thread
                thread.start()
            claimed.append(job)
        return claimed

    # -- one job -------------------------------------------------------------------------

    def _run_claimed(self, job: Job) -> None:
        lost = threading.Event()
        done = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(job.id, lost, done), name=f"reef-lease-{job.id}"
        )
        beat.start()
        try:
            JobRun(self, job, lost).run()
        finally:
            done.set()
            beat.join()
            with self._lock:
                self._threads.pop(job.id, None)

    def _heartbeat(self, job_id: str, lost: threading.Event, done: threading.Event) -> None:
        interval = max(self.lease_seconds / 3, 0.05)
        while not done.wait(interval):
            try:
                self.queue.heartbeat(job_id, self.owner, self.lease_seconds)
            except LeaseLostError as error:
                log.warning("%s", error)
                lost.set()
                return
            except StoreUnavailableError as error:
                log.warning("heartbeat of job %s failed: %s", job_id, error)


class JobRun:
    """One attempt at one job, run by a worker thread (see the module docstring)."""

    def __init__(self, worker: Worker, job: Job, lost: threading.Event) -> None:
        self.worker = worker
        self.job = job
        self.lost = lost
        self.queue = worker.queue
        self.owner = worker.owner
        self.metrics = MetricLog()  # what the learners record, for progress and result
        # The training prompts the model learner behind the candidate's model probed.
        self.probe: tuple[ProbedPrompt, ...] = ()
        self._last_progress = 0.0
        self.meter: LearningMeter | None = None  # the job's own spend, once it has a recipe
        self.stopped: TrainingDeadlineError | None = None  # a trainer's stop at the deadline

    def run(self) -> None:
        """Run the job to an end state; never raises (failures are stored on the job)."""
        job = self.job
        try:
            try:
                result = self._run()
            except LearningBudgetExhaustedError as error:
                # Before a candidate was proposed (the gate answers undecided itself):
                # nothing half-made is proposed.
                result = {"outcome": "budget_exhausted", "reason": error.message}
                result["budget"] = error.budget
                if self.stopped is not None:  # a trainer stopped mid-run: what it did
                    result["training"] = {
                        "learner": self.stopped.learner,
                        "steps_run": self.stopped.steps_run,
                        "steps_planned": self.stopped.steps_planned,
                        "minutes": round(self.stopped.minutes, 6),
                    }
            if self.meter is not None:
                result = {**result, "cost": self.meter.tally.as_dict()}
            self.queue.complete(job.id, self.owner, result)
            log.info("job %s: %s", job.id, outcome_summary(result))
        except LeaseLostError as error:
            # Someone else owns the job now (or it was cancelled): write nothing more.
            level = logging.INFO if isinstance(error, JobCancelledError) else logging.WARNING
            log.log(level, "job %s stopped: %s", job.id, error)
        except Exception as error:
            self._fail(error)

    def _fail(self, error: Exception) -> None:
        """Store the failure: retried only when its cause can pass (``retry_verdict``).
        A failure of a known kind is logged in one line; an unknown one with its
        traceback, since nobody knows yet why it failed."""
        job = self.job
        message = failure_message(error)
        verdict = retry_verdict(error, job.error)
        how = "retrying" if verdict.retry else "not retried"
        line = "job %s attempt %d failed, %s: %s: %s"
        args = (job.id, job.attempt, how, verdict.reason, message)
        if verdict.reason == UNKNOWN_REASON:
            log.exception(line, *args)
        else:
            log.warning(line, *args)
        try:
            self.queue.fail(job.id, self.owner, message, retry=verdict.retry)
        except (LeaseLostError, StoreUnavailableError) as lease_error:
            log.warning("could not record the failure of job %s: %s", job.id, lease_error)

    def _run(self) -> dict[str, Any]:
        job, chain = self.job, self.worker.chain
        recipe = self._recipe()
        self.meter = self.worker.meter_for(job.scenario, recipe)
        head = chain.head(job.scenario)
        if head is None:
            raise InvalidInputError(f"scenario {job.scenario!r} has no release to learn from")
        existing = self._existing_candidate()
        if existing is not None:
            self.queue.set_candidate(job.id, self.owner, existing.id)
            return self._proposed(existing, {"reused": True, **self._gate(recipe, existing)})
        learners = recipe.build_learners(self.worker.registry)
        self._feedback(recipe)
        published = chain.published_candidate_ids(job.scenario)
        consumed = self.queue.consumed_ids(job.scenario, candidates=published)
        trusted = trusted_references(recipe) if recipe.selection.screening.enabled else []
        batch = select_experience(
            self.worker.store,
            chain,
            job.scenario,
            recipe.selection,
            consumed,
            job.created_at,
            trusted=trusted,
            suite_prompts=suite_prompts(recipe),
        )
        self._left_out(batch)
        self.report_progress(
            0.0, f"selected {len(batch.train)} train, {len(batch.holdout)} holdout"
        )
        try:
            manifest, used, learner_metrics = self._learn(recipe, learners, head, batch)
        except NoCandidateError as error:
            if self.meter is not None:
                self.meter.refused()  # nothing made because its calls were refused
            # Nothing worth proposing in this batch (screening may have held it all back):
            # a finished job that says so; the same data would only fail the same way.
            return {"outcome": "unchanged", "reason": error.message, "selection": batch.stats}
        if manifest == head.manifest:
            return {"outcome": "unchanged", "selection": batch.stats, "metrics": learner_metrics}
        current = chain.head(job.scenario)
        stale = current is not None and current.id != head.id
        if stale and recipe.on_stale == "drop":
            return {
                "outcome": "dropped",
                "reason": "dropped: head moved",
                "trained_from": head.id,
                "head": None if current is None else current.id,
                "metrics": learner_metrics,
            }
        evidence = {
            "job_id": job.id,
            "attempt": job.attempt,
            "recipe": recipe.name,
            "metrics": learner_metrics,
            "selection": batch.stats,
            "consumed": len(used),
            "trained_from": head.id,
            "stale": stale,
        }
        self.queue.record_consumed(job.id, used)
        candidate = self._propose_once(head, manifest, evidence)
        skew = self._check_skew(recipe, candidate)
        gated = self._gate(recipe, candidate, batch)
        extra = {"stale": stale, "metrics": learner_metrics, "selection": batch.stats}
        if batch.overlap:
            extra["suite_overlap"] = overlap_summary(batch.overlap)
        return self._proposed(candidate, {**extra, **skew, **gated})

    def _feedback(self, recipe: Recipe) -> None:
        """Everything said before the job was made counts, however the passes fell:
        the signals, and the judges' grades of what is still ungraded. A judge that
        ran out of learning budget ends the job (``budget_exhausted``)."""
        job = self.job
        models = self.worker.models_for(job.scenario, self.meter)
        if recipe.signals.enabled:
            self.worker.signals.run(job.scenario, recipe.signals, self.queue.now(), models)
        for judge in recipe.judges:
            done = self.worker.judges.run(job.scenario, judge, models, self.queue.now(), whole=True)
            if done.exhausted is not None:
                raise done.exhausted

    def _left_out(self, batch: ExperienceBatch) -> None:
        """Quarantine what screening flagged, and say what else the batch left out."""
        job = self.job
        complaints = batch.stats.get("complaint_without_value", 0)
        if complaints:
            # Said aloud: these scored an answer 0 but give nothing to train on or to
            # evaluate against (docs/learning.md, "What was dropped").
            log.info(
                "job %s: %d complaint(s) without a corrected value: scored, but no target",
                job.id,
                complaints,
            )
        if batch.overlap:
            log.warning(
                "job %s: %d record(s) match gate suite items, kept out of training",
                job.id,
                len(batch.overlap),
            )
        if batch.flagged:
            held = self.worker.store.quarantine_feedback(batch.flagged)
            log.warning("job %s: quarantined %d feedback row(s)", job.id, held)

    def _check_skew(self, recipe: Recipe, candidate: Candidate) -> dict[str, Any]:
        """Before the gate: the candidate answers its model learner's probed training
        prompts through the gateway (``reef.learning.skew``). Both figures go in the
        job's metrics; a skewed candidate is rejected and the job fails, unretried.
        Nothing to do without a gate (no gateway is called then) or a probe."""
        if not recipe.gate.enabled or not self.probe:
            return {}
        worker = self.worker
        self.report_progress(0.88, f"skew check: {len(self.probe)} training prompts")
        target = gate_target(worker.settings, self.job.scenario, recipe.gate)
        report = check_skew(target, candidate.id, self.probe)
        self.metrics.record("trained_accuracy", report.trained)
        if report.served is not None:
            self.metrics.record("served_accuracy", report.served)
        self.report_progress(0.9, "skew check: done")
        if report.skewed:
            evidence = {**(candidate.evidence or {}), "skew": report.as_dict()}
            worker.chain.set_candidate_state(candidate.id, "evaluating")
            worker.chain.set_candidate_state(candidate.id, "rejected", evidence)
            raise TrainServeSkewError(report.message())
        return {"skew": report.as_dict()}

    def _gate(
        self, recipe: Recipe, candidate: Candidate, batch: ExperienceBatch | None = None
    ) -> dict[str, Any]:
        """Run the recipe's gate on ``candidate``; its outcome for the job's result.
        ``batch`` (the job's selection) tells the gate what training overlapped with
        its suites."""
        if not recipe.gate.enabled:
            return {"gate": {"action": "pending", "reason": "gate disabled in the recipe"}}
        worker = self.worker
        self.report_progress(0.9, "gate: selecting holdout")
        held = select_holdout(worker.store, worker.chain, self.job.scenario, recipe)
        gate = build_gate(
            worker.settings,
            worker.chain,
            worker.evaluations,
            worker.artifacts,
            self.job.scenario,
            recipe,
            progress=SpanProgress(self, "gate", (0.9, 0.1)),
            upstream_base_urls=worker.upstream_base_urls,
            store=worker.store,
            meter=None if self.meter is None else self.meter.child(),
        )
        outcome = gate.run(
            candidate.id, held.items, evidence_notes(held, batch), now=self.queue.now()
        )
        if worker.live_export is not None:
            send_gate_result(worker.live_export, self.job.scenario, outcome)
        self.report_progress(1.0, f"gate: {outcome.action}")
        return {"gate": outcome.as_dict()}

    def _recipe(self) -> Recipe:
        inline = self.job.input.get("recipe")
        if inline is not None:
            recipe = parse_recipe(inline, f"(job {self.job.id})", self.worker.registry)
            return recipe if recipe.name else recipe.model_copy(update={"name": "manual"})
        configured = self.worker.recipe_of(self.job.scenario)
        if configured is None:
            raise RecipeError(f"scenario {self.job.scenario!r} has no recipe to learn with")
        if configured.name is None:
            configured = configured.model_copy(update={"name": self.job.scenario})
        return configured

    def _learn(
        self, recipe: Recipe, learners: list[Learner], head: Release, batch: Any
    ) -> tuple[ReleaseManifest, list[str], dict[str, Any]]:
        manifest = head.manifest
        used: dict[str, None] = {}
        metrics: dict[str, Any] = {}
        settings = self.worker.settings
        work_root = settings.home / "jobs" / self.job.id / f"attempt-{self.job.attempt}"
        manifests = ReleaseManifests(self.worker.chain)
        for index, learner in enumerate(learners):
            self._check_lease()
            name = f"{index}:{learner.type_name}"
            span = (index / len(learners), 1 / len(learners))
            work_dir = work_root / name.replace(":", "-")
            work_dir.mkdir(parents=True, exist_ok=True)
            context = LearnerContext(
                scenario=self.job.scenario,
                head=dataclasses.replace(head, manifest=manifest),
                batch=batch,
                artifacts=self.worker.artifacts,
                home=settings.home,
                work_dir=work_dir,
                reflector=self._reflector(learner.config),
                progress=SpanProgress(self, name, span),
                metrics=self.metrics,
                harness_mode=settings.scenario(self.job.scenario).harness,
                release_manifest=manifests,
                first_rollout_share=first_rollout_share(settings, self.job.scenario),
            )
            self.report_progress(span[0], f"{name}: started")
            output = self._train(learner, context)
            if output.adapter is not None or output.checkpoint is not None:
                self.probe = output.probe  # the model now serves this learner's weights
            manifest = _with_output(manifest, output, recipe.name)
            used.update(dict.fromkeys(output.consumed))
            metrics[name] = output.metrics
            self.report_progress(span[0] + span[1], f"{name}: done")
        if self.meter is not None:
            self.meter.refused()  # a learner that swallowed a refused call is half-made
        if self.metrics.values:
            metrics["reported"] = dict(self.metrics.values)
        return manifest, list(used), metrics

    def _train(self, learner: Learner, context: LearnerContext) -> LearnerOutput:
        """``learner.learn``; for one that trains a model, admitted against the
        training-minutes budgets first, given the minutes they have left as its
        trainer's deadline, and its minutes (the queue's clock) charged on the device it
        trains on. A trainer that reached the deadline is charged at least the minutes
        its loop ran, and the job ends with the budget's refusal (``budget_exhausted``)."""
        device = training_device(learner.config)
        meter = self.meter
        if device is None or meter is None:
            return learner.learn(context)
        meter.admit_training(device)
        left = meter.training_minutes_left(device)
        context = dataclasses.replace(context, training_minutes=left)
        started = self.queue.now()
        try:
            output = learner.learn(context)
        except TrainingDeadlineError as stopped:
            meter.charge_training(device, max(self._minutes_since(started), stopped.minutes))
            self.stopped = stopped
            raise meter.training_exhausted(device) from stopped
        except BaseException:
            meter.charge_training(device, self._minutes_since(started))
            raise
        meter.charge_training(device, self._minutes_since(started))
        return output

    def _minutes_since(self, started: datetime) -> float:
        return (self.queue.now() - started).total_seconds() / 60.0

    def _propose_once(
        self, head: Release, manifest: ReleaseManifest, evidence: dict[str, Any]
    ) -> Candidate:
        # Renewing the lease proves we still own the job, and leaves a whole lease for
        # the three writes below.
        self.queue.heartbeat(self.job.id, self.owner, self.worker.lease_seconds)
        candidate = self._existing_candidate()
        if candidate is None:
            candidate = self.worker.chain.propose(
                self.job.scenario,
                manifest,
                parent_release_id=head.id,
                actor=job_actor(self.job.id),
                reason=f"learning job {self.job.id} (recipe {evidence['recipe']})",
                evidence=evidence,
            )
        self.queue.set_candidate(self.job.id, self.owner, candidate.id)
        return candidate

    def _existing_candidate(self) -> Candidate | None:
        """The candidate an earlier attempt of this job proposed, if any."""
        chain = self.worker.chain
        if self.job.candidate_id is not None:
            return chain.get_candidate(self.job.candidate_id)
        actor = job_actor(self.job.id)
        mine = [c for c in chain.candidates(self.job.scenario, limit=1000) if c.created_by == actor]
        return min(mine, key=lambda c: (c.created_at, c.id)) if mine else None

    def _proposed(self, candidate: Candidate, extra: dict[str, Any]) -> dict[str, Any]:
        return {
            "outcome": "proposed",
            "candidate_id": candidate.id,
            "parent_release_id": candidate.parent_release_id,
            **extra,
        }

    # -- callbacks for learners ----------------------------------------------------------

    def _check_lease(self) -> None:
        if self.lost.is_set():
            raise LeaseLostError(self.job.id, self.owner, "a heartbeat found the lease gone")

    def report_progress(self, fraction: float, message: str, force: bool = True) -> None:
        self._check_lease()
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_MIN_INTERVAL_SECONDS:
            return
        self._last_progress = now
        self.queue.progress(self.job.id, self.owner, fraction, message, dict(self.metrics.values))

    def _reflector(self, config: LearnerConfig) -> UpstreamReflector:
        settings = self.worker.settings
        upstream_name = config.reflector_upstream or settings.upstream_for(self.job.scenario)[0]
        return UpstreamReflector(
            settings,
            self.job.scenario,
            base_url=self.worker.upstream_base_urls.get(upstream_name),
            upstream_name=config.reflector_upstream,
            model=config.reflector_model,
        ).metered(self.meter, "reflect")


class SpanProgress:
    """The ``Progress`` of one step of a job (a learner, the gate): its reports fill the
    step's ``span`` (start, width) of the job's progress, prefixed with its ``name``, at
    most once per ``PROGRESS_MIN_INTERVAL_SECONDS``. Raises ``LeaseLostError`` once the
    job is no longer this worker's."""

    def __init__(self, run: JobRun, name: str, span: tuple[float, float]) -> None:
        self.run = run
        self.name = name
        self.span = span

    def report(self, fraction: float, message: str) -> None:
        """Report ``fraction`` (clamped to 0..1) of this step, done."""
        inside = min(max(fraction, 0.0), 1.0)
        start, width = self.span
        self.run.report_progress(start + width * inside, f"{self.name}: {message}", force=False)


def first_rollout_share(settings: ReefSettings, scenario: str) -> float | None:
    """The first step of the scenario's ``distill.rollout_steps`` (its student's first
    share of the traffic), or None when the scenario configures no distillation."""
    distill = getattr(settings.scenario(scenario), "distill", None)
    steps = getattr(distill, "rollout_steps", None) or ()
    return float(steps[0]) if steps else None


def training_device(config: LearnerConfig) -> str | None:
    """``cpu`` or ``gpu`` for a learner that trains a model (its config names a
    ``device``), None for one that does not: ``auto`` is ``gpu`` when torch, already
    loaded in this process, sees CUDA (the worker never loads torch to ask)."""
    device = getattr(config, "device", None)
    if device is None:
        return None
    if device == "auto":
        torch = sys.modules.get("torch")
        cuda = torch is not None and bool(torch.cuda.is_available())
        return "gpu" if cuda else "cpu"
    return "gpu" if device == "cuda" else "cpu"


def _with_output(
    manifest: ReleaseManifest, output: LearnerOutput, recipe: str | None
) -> ReleaseManifest:
    """``manifest`` with the learner's new components (None keeps the current one)."""
    model = manifest.model
    if output.checkpoint is not None:  # new base weights: an adapter of the old ones goes
        model = ModelComponent(base=model.base, checkpoint=output.checkpoint)
    if output.adapter is not None:
        model = ModelComponent(base=model.base, checkpoint=model.checkpoint, adapter=output.adapter)
    harness = output.harness if output.harness is not None else manifest.harness
    # A distilled scenario's routing stays with every candidate; ``distill`` sets its share.
    routing = output.routing if output.routing is not None else manifest.routing
    if model == manifest.model and harness == manifest.harness and routing == manifest.routing:
        return manifest
    return ReleaseManifest(model=model, harness=harness, recipe=recipe, routing=routing)
