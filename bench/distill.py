"""Distillation: serving the teacher alone vs a student distilled from its answers.

    .venv/bin/python bench/distill.py --model smollm2-135m --output docs/benchmarks.md
    .venv/bin/python bench/distill.py --quick    # tiny-random, a handful of items

On the quickstart's task (support-ticket triage, ``reef.quickstart.scenario``: the
held-out tickets are written from core templates the traffic never used):

- **Teacher** (``--teacher labels``, the default): one that knows the task, as the
  frontier model a team distills from would; it answers each ticket's right label, as
  ``reef quickstart --task distill``'s loopback teacher does, and its prompt is an
  expensive harness, a long few-shot system prompt (``--shots`` labelled tickets) plus
  the ticket, counted in the model's tokens (the engine's ``/tokenize``). With
  ``--teacher model`` the model itself answers behind that harness (SmolLM2-135M labels
  0% of the tickets right that way: no teacher to learn from). It answers ``--train``
  tickets as the application sends them (the short system prompt and the ticket);
  each answer is recorded for a release whose routing gives the student share 0, as
  a distilled scenario starts.
- **Student**: the bare model plus a LoRA adapter trained by the ``distill`` learner
  (``reef.learning.learners.distill``) on those records, served on the application's
  own prompt, with no few-shot harness.

Both arms then answer the same ``--test`` held-out tickets through the embedded
engine's OpenAI API (one engine, the student's adapter loaded by digest). For the
distilled arm each request goes to the student when its hash falls in
``--student-share`` (the routing share; the escalation rules are not run here), else to
the teacher. Reported per arm: held-out accuracy (the quickstart's grader), the
share of requests the teacher answered, and prompt tokens per request (the engine's
``usage``). ``--quick`` is the configuration tests/learning/test_distill_bench.py
runs: it measures the plumbing, not the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_between

from reef.core import SilentProgress
from reef.learning.base import ExperienceBatch, LearnerContext, MetricLog, TrainingExample
from reef.learning.learners.distill import DistillLearner, DistillLearnerConfig
from reef.learning.teacher import ReleaseManifests
from reef.quickstart.scenario import LABELS, SYSTEM_PROMPT, Ticket, TicketGenerator, is_correct
from reef.quickstart.teacher import teacher_harness
from reef.releases import (
    ModelComponent,
    Release,
    ReleaseChain,
    ReleaseManifest,
    RoutingComponent,
    TeacherEndpoint,
    open_artifact_store,
)

START = "<!-- distill:start -->"
END = "<!-- distill:end -->"
STUDENT = "student"


@dataclass(frozen=True)
class Answer:
    """One reply: its text, its prompt tokens and who gave it."""

    text: str
    prompt_tokens: int
    by: str


class Engine:
    """The embedded engine's OpenAI API on loopback, asked with urllib (greedy)."""

    def __init__(self, base_url: str, model: str, max_tokens: int) -> None:
        self.base_url, self.model, self.max_tokens = base_url, model, max_tokens

    def _post(self, path: str, body: dict[str, Any]) -> bytes:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as reply:
            found: bytes = reply.read()
            return found

    def ask(self, messages: list[dict[str, Any]], model: str | None = None) -> tuple[str, int]:
        """The reply text and the request's prompt tokens."""
        body = {
            "model": model or self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": 0.0,
        }
        reply = json.loads(self._post("/chat/completions", body))
        text = reply["choices"][0]["message"].get("content") or ""
        return text, int(reply["usage"]["prompt_tokens"])

    def count(self, messages: list[dict[str, Any]]) -> int:
        """The prompt tokens of ``messages`` as the engine renders a chat request."""
        url = self.base_url.removesuffix("/v1")
        request = urllib.request.Request(
            url + "/tokenize",
            data=json.dumps({"messages": messages}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as reply:
            return int(json.loads(reply.read())["count"])

    def load_adapter(self, path: Path, digest: str) -> None:
        """Serve the adapter at ``path`` as the model ``student``."""
        body = {"lora_name": STUDENT, "lora_path": str(path), "expected_digest": digest}
        self._post("/load_lora_adapter", body)


@contextmanager
def running_engine(model: str, home: Path, threads: int | None) -> Iterator[str]:
    """The engine's base URL, serving ``model`` until the block ends."""
    from reef.engine.models import load_model
    from reef.engine.runtime import Engine as Runtime
    from reef.engine.server import BackgroundServer

    server = BackgroundServer(Runtime(load_model(model, home), threads=threads)).start()
    try:
        yield server.base_url
    finally:
        server.stop()


def app_messages(ticket: Ticket) -> list[dict[str, Any]]:
    """What the application sends: its short system prompt and the ticket."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ticket.text}]


def teacher_messages(ticket: Ticket, harness: str) -> list[dict[str, Any]]:
    """The application's request as the teacher is asked it: the harness as the system."""
    return [{"role": "system", "content": harness}, {"role": "user", "content": ticket.text}]


def routed_to_student(ticket: Ticket, share: float) -> bool:
    """Whether the routing sends this request to the student (by its hash, so both the
    choice and the share are repeatable)."""
    bucket = int(hashlib.sha256(ticket.text.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return bucket < share


def recorded(ticket: Ticket, index: int, reply: str, release: Release) -> TrainingExample:
    """The teacher's answer to ``ticket`` as the record gives it to learning: the
    application's request, the teacher's reply, no feedback."""
    return TrainingExample(
        record_id=f"r{index:05d}",
        scenario=release.scenario,
        session_id=f"s{index:05d}",
        messages=app_messages(ticket),
        response={"role": "assistant", "content": reply},
        score=None,
        correction=None,
        feedback=[],
        principals=[],
        release_id=release.id,
        staleness=0,
        content_hash=f"r{index:05d}",
    )


def distill(
    work: Path, model: str, records: list[TrainingExample], release: Release, args: Any
) -> tuple[str, Path, dict[str, Any]]:
    """Train the student with the ``distill`` learner; its adapter's digest, a copy of
    it on disk and the learner's metrics."""
    artifacts = open_artifact_store(work / "artifacts")
    chain = ReleaseChain.from_url(f"sqlite:///{work / 'reef.db'}")
    try:
        context = LearnerContext(
            scenario=release.scenario,
            head=release,
            batch=ExperienceBatch(train=records, holdout=[]),
            artifacts=artifacts,
            home=work / "home",
            work_dir=work / "learn",
            reflector=_NoReflector(),
            progress=SilentProgress(),
            metrics=MetricLog(),
            release_manifest=ReleaseManifests(chain),
        )
        budget: dict[str, Any] = {"steps": args.steps} if args.steps else {}
        config = DistillLearnerConfig(model=model, threads=args.threads, seed=0, **budget)
        output = DistillLearner(config).learn(context)
    finally:
        chain.close()
    if output.adapter is None:
        raise SystemExit("distill trained nothing: no teacher answer was kept")
    return output.adapter, artifacts.materialize(output.adapter), output.metrics


class _NoReflector:
    def reflect(self, messages: list[dict[str, Any]]) -> str:
        raise AssertionError("distill asks no reflector")


def arm_figures(answers: list[Answer], tickets: list[Ticket]) -> dict[str, Any]:
    """Accuracy, the teacher's share of the answers and prompt tokens per request."""
    right = sum(is_correct(a.text, t.label) for a, t in zip(answers, tickets, strict=True))
    return {
        "accuracy": right / len(tickets),
        "teacher_share": sum(a.by == "teacher" for a in answers) / len(answers),
        "prompt_tokens_per_request": sum(a.prompt_tokens for a in answers) / len(answers),
    }


def teach(engine: Engine, ticket: Ticket, harness: str, teacher: str) -> tuple[str, int]:
    """The teacher's reply to ``ticket`` and its prompt tokens. ``labels``: a teacher that
    knows the task (the ticket's right label, as ``reef quickstart --task distill``'s
    loopback teacher answers), its prompt the few-shot harness and the ticket counted in
    the model's tokens; ``model``: the model itself behind the harness."""
    messages = teacher_messages(ticket, harness)
    if teacher == "labels":
        return ticket.label, engine.count(messages)
    return engine.ask(messages)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both arms on the held-out tickets (module docstring); the report as a dict."""
    generator = TicketGenerator(seed=args.seed)
    shots = generator.draw(args.shots, held_out=False)
    train = generator.draw(args.train, held_out=False)
    test = generator.draw(args.test, held_out=True)
    harness = teacher_harness(shots)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="reef-distill-") as scratch:
        work = Path(scratch)
        chain = ReleaseChain.from_url(f"sqlite:///{work / 'reef.db'}")
        routing = RoutingComponent(
            student_share=0.0, teacher=TeacherEndpoint(upstream="teacher", model=args.model)
        )
        release = chain.create(
            "triage",
            ReleaseManifest(model=ModelComponent(base=args.model), routing=routing),
            actor="bench",
            reason="a distilled scenario starts with the teacher serving everything",
        )
        chain.close()
        with running_engine(args.model, work / "home", args.threads) as url:
            engine = Engine(url, args.model, args.max_tokens)
            records = [
                recorded(ticket, i, teach(engine, ticket, harness, args.teacher)[0], release)
                for i, ticket in enumerate(train)
            ]
            taught = time.perf_counter()
            digest, path, metrics = distill(work, args.model, records, release, args)
            trained = time.perf_counter()
            engine.load_adapter(path, digest)
            teacher_only, distilled = [], []
            for ticket in test:
                text, tokens = teach(engine, ticket, harness, args.teacher)
                teacher_only.append(Answer(text, tokens, "teacher"))
                if routed_to_student(ticket, args.student_share):
                    text, tokens = engine.ask(app_messages(ticket), model=STUDENT)
                    distilled.append(Answer(text, tokens, STUDENT))
                else:
                    distilled.append(teacher_only[-1])
    return {
        "model": args.model,
        "teacher": args.teacher,
        "train": args.train,
        "test": args.test,
        "shots": args.shots,
        "student_share": args.student_share,
        "teacher_only": arm_figures(teacher_only, test),
        "distilled": arm_figures(distilled, test),
        "teacher_train_accuracy": sum(
            is_correct(r.response["content"] if r.response else "", t.label)
            for r, t in zip(records, train, strict=True)
        )
        / len(train),
        "training": {
            "steps": metrics.get("steps"),
            "examples": metrics.get("examples"),
            "stop_reason": metrics.get("stop_reason"),
            "seconds": round(trained - taught, 1),
        },
        "seconds": round(time.perf_counter() - started, 1),
        "adapter": digest,
    }


_TEACHERS = {
    "labels": "knows the task; few-shot harness counted",
    "model": "the model behind the few-shot harness",
}


def report_lines(report: dict[str, Any], command: str) -> list[str]:
    """The section for docs/benchmarks.md."""
    rows = []
    for arm, label in (
        ("teacher_only", f"teacher only ({_TEACHERS[report['teacher']]})"),
        ("distilled", "distilled student"),
    ):
        figures = report[arm]
        rows.append(
            f"| {label} | {figures['accuracy']:.1%} | {figures['teacher_share']:.0%} "
            f"| {figures['prompt_tokens_per_request']:.0f} |"
        )
    training = report["training"]
    return [
        f"Model `{report['model']}`, {report['train']} teacher answers recorded, "
        f"{report['test']} held-out tickets, {report['shots']} shots in the teacher's "
        f"harness, student share {report['student_share']:g} (no escalation rules run):",
        "",
        "```",
        command,
        "```",
        "",
        "| arm | held-out accuracy | teacher calls | prompt tokens per request |",
        "|---|---|---|---|",
        *rows,
        "",
        f"The teacher was right on {report['teacher_train_accuracy']:.1%} of the recorded "
        f"training tickets; `distill` trained {training['steps']} steps on "
        f"{training['examples']} examples ({training['stop_reason']}, "
        f"{training['seconds']} s).",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--train", type=int, default=120, help="teacher answers recorded")
    parser.add_argument("--test", type=int, default=60, help="held-out tickets asked")
    parser.add_argument("--shots", type=int, default=24, help="examples in the teacher's harness")
    parser.add_argument("--student-share", type=float, default=1.0)
    parser.add_argument(
        "--teacher",
        choices=("labels", "model"),
        default="labels",
        help="labels: a teacher that knows the task (the right label; its few-shot prompt "
        "counted); model: --model itself behind the few-shot harness",
    )
    parser.add_argument("--steps", type=int, default=None, help="exact steps (default: the budget)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="tiny-random, a few items")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.model, args.train, args.test, args.shots = "tiny-random", 8, 6, 6
        args.steps, args.max_tokens = args.steps or 2, 4
    if not 0.0 <= args.student_share <= 1.0:
        parser.error("--student-share must lie in [0, 1]")
    if args.train < 1 or args.test < 1 or args.shots < len(LABELS):
        parser.error(f"--train and --test must be at least 1, --shots at least {len(LABELS)}")
    report = run(args)
    print(json.dumps(report, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    if args.output is not None:
        command = (
            f".venv/bin/python bench/distill.py --model {args.model} --train {args.train} "
            f"--test {args.test} --shots {args.shots} --student-share {args.student_share:g} "
            f"--teacher {args.teacher}"
        )
        write_between(args.output, START, END, "\n".join(report_lines(report, command)))


if __name__ == "__main__":
    main()
