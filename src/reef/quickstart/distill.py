"""``reef quickstart --task distill``: the triage application on a frontier-like teacher,
then on a student distilled from it (docs/distillation.md).

Reads top to bottom: the teacher starts on loopback in this process (``teacher``: it
knows every ticket's label and reads a long few-shot harness first), the configuration
makes the triage scenario distilled from it (``write_distill_config``), the engine
(the student's model), gateway and worker start. Then:

1. the first release routes everything to the teacher (student share 0): the held-out
   tickets are measured on it (teacher only);
2. ``--requests`` tickets of traffic with no feedback at all, all answered by the teacher
   and recorded;
3. one learning job: ``distill`` trains the student's adapter on the teacher's answers,
   and the gate compares it with the teacher on the held-out traffic
   (non-inferiority, margin ``DISTILL_MARGIN``); a passed student starts as a canary at
   the first rollout step;
4. the rollout: live traffic, still without feedback, until the canary monitor has
   promoted every step (``DISTILL_STEPS``), or dropped one (back to the teacher), or
   ``ROLLOUT_BATCHES`` batches were sent; the worker's live teacher checks (the teacher
   asked what the student answered) are each step's evidence;
5. the held-out tickets are measured again on what serves (distilled).

Each measurement asks the held-out tickets as live traffic is routed (recorded as
``eval``, never trained on) and reports accuracy, the share the teacher answered and
prompt tokens per request (the response's ``usage``: the teacher counts its harness).
The figures go to the console and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import openai
from rich.console import Console
from rich.table import Table

from reef.quickstart.application import Answer, TriageApp, run_concurrently
from reef.quickstart.errors import QuickstartError
from reef.quickstart.rounds import RoundResult, Rounds
from reef.quickstart.scenario import Ticket, TicketGenerator, is_correct
from reef.quickstart.stack import Stack
from reef.quickstart.teacher import Teacher, teacher_harness
from reef.quickstart.workspace import (
    DISTILL_MARGIN,
    DISTILL_STEPS,
    SCENARIO,
    Workspace,
    training_threads,
    write_distill_config,
)

SHOTS = 24  # labelled tickets in the teacher's harness (as bench/distill.py)
ROLLOUT_BATCHES = 8  # most batches of live traffic the rollout sends
DECIDE_TIMEOUT_SECONDS = 60.0  # how long the worker gets to decide a canary per batch
EPOCHS = 3.0  # passes over the traffic's examples (workspace.distill_recipe_yaml says why)


@dataclass(frozen=True)
class Arm:
    """The held-out figures of what served at one time."""

    release_id: str
    accuracy: float
    teacher_share: float
    prompt_tokens_per_request: float
    total: int


@dataclass(frozen=True)
class Reply:
    """One held-out answer: right or not, who answered, its prompt tokens."""

    correct: bool
    served_by: str
    prompt_tokens: int


def run_distill(
    options: Any, workspace: Workspace, console: Console, port: int, started: float
) -> dict[str, Any]:
    """Everything ``--task distill`` does (module docstring); the summary it wrote."""
    generator = TicketGenerator(options.seed)
    shots = generator.draw(SHOTS, held_out=False)
    traffic = generator.draw(options.requests, held_out=False)
    heldout = generator.draw(options.heldout, held_out=True)
    labels = {t.text.strip(): t.label for t in [*traffic, *heldout]}
    batch = max(options.requests // 2, 12)  # tickets per rollout batch
    # Each arm's scored requests before the canary monitor decides a step: about half a
    # batch lands on each arm, and the live interval needs ~50 per arm to clear -0.1
    # with a student one or two answers short of a perfect teacher.
    min_requests = max(batch * 2 // 5, 4)
    console.print(
        f"[bold]Reef quickstart --task distill[/bold] in {workspace.root}: triage on a teacher "
        f"(a loopback model that labels every ticket right, behind a {SHOTS}-shot prompt), "
        f"then on {options.model} distilled from its answers to {options.requests} tickets "
        f"without feedback; held-out set of {options.heldout} tickets."
    )
    with Teacher(labels, teacher_harness(shots)) as teacher:
        settings = write_distill_config(
            workspace,
            options.model,
            port,
            EPOCHS,
            teacher.base_url,
            dtype=options.dtype,
            threads=training_threads(),
            min_requests=min_requests,
        )
        with Stack(settings, workspace.logs / "engine.log") as stack:
            with console.status("starting the engine, the gateway and the learning worker"):
                ready = stack.start_engine()
                teacher.engine_url = ready.base_url
                stack.start_gateway()
                stack.start_worker()
            console.print(
                f"student: {ready.model} at {ready.base_url}; teacher at {teacher.base_url}"
            )
            app = TriageApp(stack.url, SCENARIO)
            try:
                world = _World(stack, app, console, teacher, generator, labels, batch)
                summary = _loop(world, traffic, heldout)
            finally:
                app.close()
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["model"] = options.model
    workspace.summary_json.write_text(json.dumps(summary, indent=2), encoding="utf-8")
    _print(console, summary)
    return summary


@dataclass
class _World:
    """What the run drives: the started stack, the application, the console, the
    teacher, the ticket generator, the labels the teacher knows, the rollout's batch."""

    stack: Stack
    app: TriageApp
    console: Console
    teacher: Teacher
    generator: TicketGenerator
    labels: dict[str, str]
    batch: int


def _loop(world: _World, traffic: list[Ticket], heldout: list[Ticket]) -> dict[str, Any]:
    stack, app, console, teacher = world.stack, world.app, world.console, world.teacher
    before = _measure(app, stack, heldout)
    console.print(_arm_line("teacher only", before))
    run_concurrently(app.ask, traffic, lambda _answer: None)  # no feedback at all
    console.print(f"traffic: {len(traffic)} tickets, no feedback; teacher calls {teacher.calls}")
    rounds = Rounds(stack, app, SCENARIO, console)
    result = RoundResult(1)
    rounds.learn(result)
    if result.job_state != "succeeded":
        raise QuickstartError(
            f"the distill job {result.job_id} {result.job_state}: {result.job_error}"
        )
    console.print(f"gate: {result.gate_action} ({_decision(result)})")
    steps: list[float] = []
    if result.gate_action == "canary":
        steps = _rollout(world)
    head = stack.chain().head(SCENARIO)
    if head is None:
        raise QuickstartError(f"scenario {SCENARIO!r} has no release")
    rounds.wait_serving(head.id)
    after = _measure(app, stack, heldout)
    console.print(_arm_line("distilled", after))
    return {
        "task": "distill",
        "traffic": len(traffic),
        "heldout": len(heldout),
        "margin": DISTILL_MARGIN,
        "rollout_steps": list(DISTILL_STEPS),
        "shares_promoted": steps,
        "job_id": result.job_id,
        "candidate_id": result.candidate_id,
        "gate_action": result.gate_action,
        "gate": result.gate,
        "teacher_only": asdict(before),
        "distilled": asdict(after),
    }


def _rollout(world: _World) -> list[float]:
    """Live traffic without feedback until every step is promoted or one is dropped
    (decided on the worker's teacher checks); the shares promoted."""
    app, console, generator, labels = world.app, world.console, world.generator, world.labels
    chain = world.stack.chain()
    promoted: list[float] = []
    for number in range(1, ROLLOUT_BATCHES + 1):
        canary = chain.canaries().get(SCENARIO)
        if canary is None:
            break
        tickets = generator.draw(world.batch, held_out=False)
        labels.update({t.text.strip(): t.label for t in tickets})
        answers = run_concurrently(_live(app), tickets, lambda _answer: None)
        right = sum(a.correct for a in answers) / len(answers)
        deadline = time.monotonic() + DECIDE_TIMEOUT_SECONDS
        while time.monotonic() < deadline:  # the worker checks canaries on every pass
            state = chain.get_candidate(canary.id).state
            if state != "canary":
                break
            time.sleep(0.5)
        state = chain.get_candidate(canary.id).state
        head = chain.head(SCENARIO)
        share = head.manifest.routing.student_share if head and head.manifest.routing else 0.0
        console.print(
            f"rollout batch {number}: {len(tickets)} tickets, no feedback (right {right:.0%}); "
            f"canary {state}; serving student share {share:g}"
        )
        if state == "published":  # promoted: the next step, if any, is the new canary
            promoted.append(share)
        elif state == "abandoned":
            break
    return promoted


def _live(app: TriageApp) -> Callable[[Ticket], Answer]:
    """One unit of live traffic with no feedback: asked in its ticket's session."""

    def ask(ticket: Ticket) -> Answer:
        return app.ask(ticket, {"x-reef-session": app.traffic_session(ticket.text)})

    return ask


def _ask(app: TriageApp, ticket: Ticket) -> Reply:
    try:
        raw = app.client.chat.completions.with_raw_response.create(
            model=f"reef/{SCENARIO}",
            messages=[{"role": "user", "content": ticket.text}],
            extra_headers={"x-reef-purpose": "eval"},
        )
    except openai.APIError as error:
        raise QuickstartError(f"the gateway failed a request: {error}") from error
    completion = raw.parse()
    text = completion.choices[0].message.content or ""
    tokens = completion.usage.prompt_tokens if completion.usage else 0
    served_by = raw.headers.get("x-reef-served-by", "student")
    return Reply(is_correct(text, ticket.label), served_by, tokens)


def _measure(app: TriageApp, stack: Stack, tickets: Sequence[Ticket]) -> Arm:
    """The held-out tickets asked as live traffic is routed now."""
    head = stack.chain().head(SCENARIO)
    if head is None:
        raise QuickstartError(f"scenario {SCENARIO!r} has no release")
    replies = run_concurrently(lambda t: _ask(app, t), tickets, lambda _reply: None)
    total = len(replies)
    return Arm(
        release_id=head.id,
        accuracy=sum(r.correct for r in replies) / total,
        teacher_share=sum(r.served_by == "teacher" for r in replies) / total,
        prompt_tokens_per_request=sum(r.prompt_tokens for r in replies) / total,
        total=total,
    )


def _decision(result: RoundResult) -> str:
    decision = (result.gate or {}).get("decision")
    if isinstance(decision, dict):
        reasons = decision.get("reasons") or []
        return "; ".join(str(r) for r in reasons) or str(decision.get("verdict"))
    return str(decision)


def _arm_line(label: str, arm: Arm) -> str:
    return (
        f"{label}: held-out accuracy {arm.accuracy:.0%}, teacher calls "
        f"{arm.teacher_share:.0%}, {arm.prompt_tokens_per_request:.0f} prompt tokens per request"
    )


def _print(console: Console, summary: dict[str, Any]) -> None:
    table = Table(title="distillation: held-out tickets")
    for column in ("serving", "accuracy", "teacher calls", "prompt tokens / request"):
        table.add_column(column)
    for key, label in (("teacher_only", "teacher only"), ("distilled", "distilled")):
        arm = summary[key]
        table.add_row(
            label,
            f"{arm['accuracy']:.0%}",
            f"{arm['teacher_share']:.0%}",
            f"{arm['prompt_tokens_per_request']:.0f}",
        )
    console.print(table)
