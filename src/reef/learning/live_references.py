"""Live teacher checks, the worker's half: ask the teacher what the student answered.

While a distilled scenario's student release is a canary (``scenarios.<s>.distill.
live_references``; which records are checked and how they count:
``reef.evaluation.teacher_checks``), each worker pass takes the checked records the
student answered on either arm that have no check yet, oldest first, and for each:

1. asks the canary's teacher (``routing.teacher``) the same request, as the upstream got
   it (the record's rendered request: harness included), non-streaming, with the
   teacher's model, capped at ``max_tokens`` when the request sets no cap; the call is
   Reef's own spend (``purpose: teacher``, admitted and charged by the scenario's
   learning budgets) and is recorded with purpose ``judge`` (never trained on), tag
   ``teacher_check`` naming the checked record;
2. scores the student's answer against the teacher's with the gate's scorer (the
   recipe's ``gate.scorer``; a teacher answer of tool calls by ``tool_call``), as the
   gate scores a held-out item whose reference the teacher gave;
3. writes the score on the student's record as feedback of source ``judge:teacher``
   (confidence 1), author ``teacher:<upstream>/<model>`` at trust ``operator``,
   idempotency key ``<author>:<record id>``; when the answers differ (score below 1) the
   teacher's answer is its correction, so the ``distill`` learner can train the student
   on the teacher's answer to a prompt the student got wrong (on-policy data).

Outside a canary, with ``on_policy_fraction`` above 0, the same checks run on that share
of the answers the serving release's student gives (its records since it was
published): no decision reads them, but each corrected answer is on-policy data for the
next ``distill`` job, within the same call caps and learning budgets.

A teacher answer with nothing to compare (empty) is written without a score (void: the
record then counts for neither arm). A failed call ends the pass; the record stays
pending and is asked again on the next pass (the canary waits meanwhile). At most
``calls_per_pass`` calls a pass and ``max_calls_per_hour`` an hour. By default nothing
is asked outside a canary: once the rollout's last step is promoted, the student serves
with no teacher calls but its escalations.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from reef.config import ReefSettings
from reef.config.distill import LiveReferencesConfig
from reef.core import canonical_json, new_id, sha256_hex
from reef.core.errors import ReefError
from reef.core.routing import TeacherEndpoint, teacher_label
from reef.evaluation import (
    CHECK_SOURCE,
    EvalItem,
    GateConfig,
    ScorerContext,
    ScorerRegistry,
    TeacherChecks,
    needs_check,
    parse_reply,
)
from reef.experience import (
    ExperienceStore,
    FeedbackDraft,
    IdempotencyConflictError,
    LearningBudgetExhaustedError,
    LearningMeter,
    RecordDraft,
    RecordFilter,
    RecordView,
    Redactor,
    canonical_exchange,
)
from reef.learning.judges import with_spend
from reef.learning.reflect import UpstreamReflector
from reef.releases import ReleaseChain

log = logging.getLogger(__name__)

CHECK_TAG = "teacher_check"  # on the teacher call's record: the checked record's id
_PAGE = 500
_PATHS = {"openai.chat": "/chat/completions", "anthropic.messages": "/messages"}


@dataclass
class CheckPass:
    """What one pass of live teacher checks did in one scenario."""

    checked: int = 0
    calls: int = 0
    waiting: int = 0  # checked records still without a check after the pass
    error: str | None = None
    exhausted: LearningBudgetExhaustedError | None = None
    scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Target:
    """What a pass checks: the teacher to ask, the fraction checked, the (purpose,
    release id) pairs whose records count, and since when."""

    teacher: TeacherEndpoint
    fraction: float
    arms: set[tuple[str, str | None]]
    since: str


class LiveReferenceWriter:
    """Asks a distilled canary's teacher about the student's answers and writes the
    checks (module docstring). ``redactor`` scrubs the call records and the feedback
    as the gateway scrubs what it stores."""

    def __init__(
        self,
        settings: ReefSettings,
        store: ExperienceStore,
        chain: ReleaseChain,
        base_urls: dict[str, str] | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.chain = chain
        self.base_urls = dict(base_urls or {})
        self.redactor = redactor or Redactor(())

    def run(
        self,
        scenario: str,
        config: LiveReferencesConfig,
        gate: GateConfig | None,
        meter: LearningMeter | None,
        now: datetime | None = None,
        models: Any = None,
    ) -> CheckPass:
        """One pass over ``scenario``'s live routed canary, if it has one; ``gate`` is
        the recipe's gate configuration (its scorer; None: the defaults); ``models`` a
        ``ConfiguredModel`` for a scorer that asks one (``llm_judge``)."""
        done = CheckPass()
        target = self._target(scenario, config)
        if target is None:
            return done
        now = now or datetime.now(UTC)
        teacher = target.teacher
        hourly = config.max_calls_per_hour - self._calls_last_hour(scenario, now)
        budget = min(hourly, config.calls_per_pass)
        reflector = UpstreamReflector(
            self.settings,
            scenario,
            base_url=self.base_urls.get(teacher.upstream),
            upstream_name=teacher.upstream,
            model=teacher.model,
        ).metered(meter, "teacher")
        checks = TeacherChecks.of(target.fraction, reflector.dialect)
        waiting = self._waiting(scenario, target, checks, now)
        scoring = _Scoring(gate or GateConfig(), ScorerContext(model=models))
        for record in waiting:
            if budget <= 0:
                break
            body = teacher_body(record, teacher.model, config.max_tokens)
            try:
                answer = reflector.complete(_PATHS[record.api], body)
            except LearningBudgetExhaustedError as error:
                done.exhausted = error
                log.info("teacher checks of %r stopped: %s", scenario, error)
                break
            except ReefError as error:
                done.error = f"{type(error).__name__}: {error}"
                log.warning("teacher checks of %r stopped: %s", scenario, done.error)
                break
            budget -= 1
            done.calls += 1
            call_id = self._record_call(record, body, answer, reflector)
            score, reference = scoring.score(record, body, answer)
            if self._write(record, teacher, score, reference, call_id):
                done.checked += 1
                if score is not None:
                    done.scores[record.id] = score
        done.waiting = len(waiting) - done.checked
        if done.checked:
            log.info("teacher checks of %r: %d answers checked", scenario, done.checked)
        return done

    # -- reading --------------------------------------------------------------------------

    def _target(self, scenario: str, config: LiveReferencesConfig) -> _Target | None:
        """What this pass checks: a live routed canary's two arms (``fraction``), else
        the serving student's answers (``on_policy_fraction``), else nothing."""
        candidate = self.chain.canaries().get(scenario)
        head = self.chain.head(scenario)
        head_id = None if head is None else head.id
        routing = None if candidate is None else candidate.manifest.routing
        if candidate is not None and routing is not None:
            if config.fraction <= 0:
                return None
            canary = (candidate.evidence or {}).get("canary") or {}
            arms = {("canary", candidate.id), ("serve", head_id)}
            return _Target(routing.teacher, config.fraction, arms, str(canary.get("started_at")))
        serving = None if head is None else head.manifest.routing
        if head is None or serving is None or serving.student_share <= 0:
            return None
        if config.on_policy_fraction <= 0:
            return None
        since = head.created_at.isoformat()
        return _Target(serving.teacher, config.on_policy_fraction, {("serve", head.id)}, since)

    def _waiting(
        self, scenario: str, target: _Target, checks: TeacherChecks, now: datetime
    ) -> list[RecordView]:
        """The target's checked student answers without a check, oldest first."""
        found = []
        for record in self.store.iter_export(scenario, since=target.since):
            on_arm = (record.purpose, record.release_id) in target.arms
            if on_arm and record.created_at <= now and needs_check(record, checks):
                found.append(record)
        return sorted(found, key=lambda r: (r.created_at, r.id))

    def _calls_last_hour(self, scenario: str, now: datetime) -> int:
        calls, cursor = 0, None
        filters = RecordFilter(since=now - timedelta(hours=1), purpose="judge")
        while True:
            page = self.store.list_records(scenario, filters, cursor, _PAGE)
            calls += sum(CHECK_TAG in record.tags for record in page.records)
            if page.next_cursor is None:
                return calls
            cursor = page.next_cursor

    # -- writing --------------------------------------------------------------------------

    def _record_call(
        self,
        record: RecordView,
        body: dict[str, Any],
        answer: Any,
        reflector: UpstreamReflector,
    ) -> str:
        """Record the teacher's call (purpose ``judge``); its record id."""
        draft = RecordDraft(
            id=new_id(),
            scenario=record.scenario,
            session_id=new_id(),
            api=record.api,  # type: ignore[arg-type]  # one of _PATHS, both record APIs
            request=body,
            response=answer if isinstance(answer, dict) else None,
            status="ok",
            error=None,
            latency_ms=0.0,
            usage=None,
            release_id=record.release_id,
            prompt_hash=record.prompt_hash,
            content_hash="sha256:" + sha256_hex(canonical_json([body, answer])),
            continuation_hash=None,
            tags={CHECK_TAG: record.id},
            purpose="judge",
            session_is_new=True,
        )
        usage, price = reflector.last_call
        draft = with_spend(draft, usage, price)
        return self.store.write_records([self.redactor.redact_draft(draft)])[0]

    def _write(
        self,
        record: RecordView,
        teacher: TeacherEndpoint,
        score: float | None,
        reference: Any,
        call_id: str,
    ) -> bool:
        author = teacher_label(teacher)
        differs = score is not None and score < 1.0 and reference is not None
        draft = FeedbackDraft(
            scenario=record.scenario,
            record_ids=(record.id,),
            score=score,
            feedback=None if score is not None else "the teacher's answer was empty",
            correction=reference if differs else None,
            metadata={"teacher_record_id": call_id, "teacher": author},
            principal=author,
            idempotency_key=f"{author}:{record.id}",
            trust="operator",
            source=CHECK_SOURCE,
            confidence=1.0,
        )
        try:
            _, created = self.store.add_feedback(self.redactor.redact_feedback(draft))
        except IdempotencyConflictError:
            return False  # checked before (by another worker) with another verdict
        return created


def teacher_body(record: RecordView, model: str, max_tokens: int) -> dict[str, Any]:
    """The request ``record``'s upstream got (its rendered request, else the client's)
    for the teacher: its model, one non-streaming answer, a ``max_tokens`` cap when the
    request sets none."""
    body = dict(record.rendered_request or record.request)
    body["model"] = model
    for streaming in ("stream", "stream_options"):
        body.pop(streaming, None)
    if record.api == "openai.chat":
        body.pop("n", None)
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = max_tokens
    elif body.get("max_tokens") is None:
        body["max_tokens"] = max_tokens
    return body


class _Scoring:
    """The gate's scorer on a student answer against the teacher's (module docstring)."""

    def __init__(self, gate: GateConfig, context: ScorerContext) -> None:
        registry = ScorerRegistry()
        self.text = registry.build(gate.scorer, "gate.scorer", context)
        self.tools = registry.build({"type": "tool_call"}, "tool_call", context)

    def score(
        self, record: RecordView, body: dict[str, Any], answer: Any
    ) -> tuple[float | None, Any]:
        """The student's score and the teacher's answer as a reference (text, or
        ``{"tool_calls": [...]}``); (None, None) when the teacher's answer is empty."""
        answered = answer if isinstance(answer, dict) else None
        taught = canonical_exchange(replace(record, request=body, response=answered))
        reply = taught.reply or {}
        calls = reply.get("tool_calls")
        content = reply.get("content")
        if calls:
            reference: Any = {"tool_calls": calls}
        elif isinstance(content, str) and content.strip():
            reference = content
        else:
            return None, None
        student = canonical_exchange(record)
        item = EvalItem(
            id=record.id,
            suite="holdout",
            messages=student.messages,
            reference=reference,
            scorer={"type": "tool_call"} if calls else None,
        )
        said = parse_reply({"choices": [{"message": student.reply or {}}]})
        scorer = self.tools if calls else self.text
        return scorer.score_reply(said, item).score, reference
