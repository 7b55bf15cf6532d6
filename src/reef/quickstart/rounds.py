"""The quickstart's rounds: traffic with feedback, a learning job (learners, then the
gate), and a held-out measurement of whatever serves afterwards.

Everything measured lands in plain dataclasses (``HeldOut``, ``RoundResult``), which
the console, ``report.html`` and ``summary.json`` are made from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from reef.jobs import Job
from reef.quickstart.application import Answer, App, Graded, run_concurrently
from reef.quickstart.errors import QuickstartError
from reef.quickstart.scenario import is_correct
from reef.quickstart.stack import Stack

GOOD_AT = 0.5  # a signal scoring below this calls the answer wrong
JOB_POLL_SECONDS = 0.5
# A round's learning job (training and the gate) took 899 s for the agent task on 2 shared
# cores (docs/benchmarks.md); on a machine busy with other work it ran past 30 minutes
# while still making progress, which the bar shows. Give up only on a job that is stuck.
JOB_TIMEOUT_SECONDS = 7200.0
ACTIVATION_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class HeldOut:
    """Held-out accuracy of one release."""

    release_id: str
    seq: int
    correct: int
    total: int
    seconds: float

    @property
    def accuracy(self) -> float:
        """Share of held-out tickets answered with exactly the right label."""
        return self.correct / self.total if self.total else 0.0


@dataclass(frozen=True)
class Signals:
    """How well the round's conversation signals told wrong answers from right ones:
    ``flagged`` answers the signals called wrong, ``right`` of those truly wrong, out of
    ``wrong`` wrong answers in the traffic; ``corrections_right`` extracted corrections
    equal to the true label, of ``corrections``."""

    flagged: int
    right: int
    wrong: int
    corrections: int
    corrections_right: int

    @property
    def precision(self) -> float | None:
        return self.right / self.flagged if self.flagged else None

    @property
    def recall(self) -> float | None:
        return self.right / self.wrong if self.wrong else None


@dataclass
class RoundResult:
    """What one round did and measured."""

    number: int
    traffic: int = 0
    traffic_correct: int = 0
    corrections: int = 0
    feedback: int = 0  # items posted: one per ticket (triage), more for an agent's fallbacks
    traffic_seconds: float = 0.0
    job_id: str | None = None
    job_state: str | None = None
    job_error: str | None = None
    outcome: str | None = None
    learn_seconds: float = 0.0
    learners: dict[str, Any] = field(default_factory=dict)
    candidate_id: str | None = None
    components: dict[str, Any] = field(default_factory=dict)
    new_components: list[str] = field(default_factory=list)
    gate_action: str | None = None
    gate: dict[str, Any] = field(default_factory=dict)
    published_release_id: str | None = None
    heldout: HeldOut | None = None
    # Implicit feedback: what the users said, and how Reef's signals read it (``Signals``).
    follow_ups: int = 0
    signals: Signals | None = None

    @property
    def traffic_accuracy(self) -> float:
        """Share of live tickets the serving release answered right."""
        return self.traffic_correct / self.traffic if self.traffic else 0.0


def _progress(console: Console) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(bar_width=30),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@contextmanager
def _timed() -> Iterator[Callable[[], float]]:
    started = time.monotonic()
    yield lambda: time.monotonic() - started


class Rounds:
    """Drives the application and the learning loop against a started ``Stack``."""

    def __init__(
        self,
        stack: Stack,
        app: App,
        scenario: str,
        console: Console,
        implicit: bool = False,
        seed: int = 0,
        metric: str = "accuracy",
    ) -> None:
        self.stack = stack
        self.app = app
        self.scenario = scenario
        self.console = console
        self.implicit = implicit
        self.seed = seed
        self.metric = metric
        self._answers: list[Graded] = []

    # -- measuring ----------------------------------------------------------------------

    def head(self) -> tuple[str, int]:
        """The id and seq of the scenario's head release."""
        head = self.stack.chain().head(self.scenario)
        if head is None:
            raise QuickstartError(f"scenario {self.scenario!r} has no release")
        return head.id, head.seq

    def measure(self, label: str, tickets: Sequence[object]) -> HeldOut:
        """Held-out accuracy of the head release, every ticket pinned to it."""
        release_id, seq = self.head()
        with _progress(self.console) as progress, _timed() as elapsed:
            task = progress.add_task(f"{label}: held-out {self.metric}", total=len(tickets))
            right = 0

            def counted(answer: Graded) -> None:
                nonlocal right
                right += answer.correct
                done = progress.tasks[task].completed + 1
                progress.update(
                    task,
                    advance=1,
                    description=f"{label}: held-out {self.metric} {right / done:.0%}",
                )

            answers = run_concurrently(
                lambda ticket: self.app.measure(ticket, release_id), tickets, counted
            )
            seconds = elapsed()
        return HeldOut(release_id, seq, sum(a.correct for a in answers), len(answers), seconds)

    # -- one round ----------------------------------------------------------------------

    def traffic(self, result: RoundResult, tickets: Sequence[object]) -> None:
        """Live traffic: every ticket answered, then graded and given feedback, or (with
        implicit feedback) answered by its user in the conversation."""
        label = f"round {result.number}"
        what = "traffic + replies" if self.implicit else "traffic + feedback"
        with _progress(self.console) as progress, _timed() as elapsed:
            task = progress.add_task(f"{label}: {what}", total=len(tickets))

            def counted(answer: Graded) -> None:
                result.traffic += 1
                result.traffic_correct += answer.correct
                posted = 0 if self.implicit else 1
                result.feedback += getattr(answer, "feedback_posted", posted)
                corrected = int(not answer.correct and not self.implicit)
                result.corrections += getattr(answer, "corrections_posted", corrected)
                result.follow_ups += answer.follow_up is not None
                right = f"right {result.traffic_accuracy:.0%}"
                progress.update(task, advance=1, description=f"{label}: {what} ({right})")

            def serve(ticket: object) -> Graded:
                if self.implicit:
                    return self.app.serve_and_reply(ticket, self.seed)
                return self.app.serve_and_grade(ticket)

            self._answers = run_concurrently(serve, tickets, counted)
            result.traffic_seconds = elapsed()

    def read_signals(self, result: RoundResult) -> None:
        """How the signals the worker wrote for this round's answers compare with the
        truth the simulation knows (``Signals``)."""
        if not self.implicit or self.stack.store is None:
            return
        flagged = right = corrections = corrections_right = 0
        answers = [a for a in self._answers if isinstance(a, Answer)]
        for answer in answers:
            if answer.record_id is None:
                continue
            rows = [
                fb
                for fb in self.stack.store.get_record(answer.record_id).feedback
                if fb.source.startswith("signal:")
            ]
            if any((fb.score or 0.0) < GOOD_AT for fb in rows):
                flagged += 1
                right += not answer.correct
            fixes = [fb.correction for fb in rows if isinstance(fb.correction, str)]
            if fixes:
                corrections += 1
                corrections_right += is_correct(fixes[-1], answer.ticket.label)
        wrong = sum(not answer.correct for answer in answers)
        result.signals = Signals(flagged, right, wrong, corrections, corrections_right)

    def learn(self, result: RoundResult) -> None:
        """Queue a learning job and follow it to its end: learners, then the gate."""
        label = f"round {result.number}"
        job_id = self.app.learn()
        result.job_id = job_id
        queue = self.stack.jobs()
        with _progress(self.console) as progress, _timed() as elapsed:
            task = progress.add_task(f"{label}: learning", total=100)
            deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
            while True:
                job = queue.get(job_id)
                progress.update(
                    task,
                    completed=round(100 * (job.progress or 0.0)),
                    description=f"{label}: {_job_line(job)}",
                )
                if job.state in ("succeeded", "failed", "cancelled"):
                    break
                if time.monotonic() > deadline:
                    queue.cancel(job_id)
                    raise QuickstartError(f"learning job {job_id} ran past {JOB_TIMEOUT_SECONDS} s")
                time.sleep(JOB_POLL_SECONDS)
            progress.update(task, completed=100)
            result.learn_seconds = elapsed()
        self._read_job(result, job)

    def _read_job(self, result: RoundResult, job: Job) -> None:
        result.job_state = job.state
        result.job_error = job.error
        outcome = job.result or {}
        result.outcome = outcome.get("outcome")
        result.learners = {
            name: value
            for name, value in (outcome.get("metrics") or {}).items()
            if name != "reported"
        }
        result.candidate_id = outcome.get("candidate_id")
        gate = outcome.get("gate") or {}
        result.gate_action = gate.get("action")
        result.published_release_id = gate.get("release_id")
        if result.candidate_id is not None:
            candidate = self.stack.chain().get_candidate(result.candidate_id)
            manifest = candidate.manifest
            result.components = {"adapter": manifest.model.adapter, "harness": manifest.harness}
            if candidate.parent_release_id is not None:
                parent = self.stack.chain().get_release(candidate.parent_release_id).manifest
                result.new_components = [
                    kind
                    for kind, mine, theirs in (
                        ("adapter", manifest.model.adapter, parent.model.adapter),
                        ("harness", manifest.harness, parent.harness),
                    )
                    if mine != theirs
                ]
            evidence = (candidate.evidence or {}).get("gate") or {}
            result.gate = {
                "decision": evidence.get("decision") or gate.get("decision"),
                "cost": evidence.get("cost") or gate.get("cost") or {},
                "evaluation_id": evidence.get("evaluation_id"),
            }

    def wait_serving(self, release_id: str) -> None:
        """Wait until the gateway serves ``release_id`` (it stages the adapter first), so
        the next round's traffic meets it."""
        deadline = time.monotonic() + ACTIVATION_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.app.serving_release() == release_id:
                return
            time.sleep(0.25)
        raise QuickstartError(f"the gateway did not start serving release {release_id}")


def _job_line(job: Job) -> str:
    if job.state == "queued":
        return "learning: queued" + (f" (attempt {job.attempt})" if job.attempt > 1 else "")
    message = (job.message or job.state).replace("[", "(").replace("]", ")")
    return f"learning: {message[:70]}"
