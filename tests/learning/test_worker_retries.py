"""A learning job whose gate fails is retried only when the failure can pass.

The whole path runs for real: the worker claims the job from the queue, its learner
proposes a harness candidate, and the gate asks the held-out items through a gateway on
loopback, in front of a fake model server that refuses every request (a 400 naming a
field: it will recur, so the job fails at once) or is unavailable (503: an outage, so
the job goes back to the queue for another attempt).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
from aiohttp import web

from reef.config import ReefSettings
from reef.core import new_id
from reef.evaluation import EvaluationStore
from reef.experience import FeedbackDraft, RecordDraft
from reef.harness import Bundle, Harness, pack_bundle
from reef.jobs import Job, JobQueue
from reef.learning.base import Learner, LearnerConfig, LearnerContext, LearnerOutput
from reef.learning.recipes import parse_recipe
from reef.learning.registry import LearnerRegistry
from reef.learning.undecided import VOID_RETRY_SECONDS
from reef.learning.worker import Worker
from reef.releases import ModelComponent, ReleaseChain, ReleaseManifest, open_artifact_store
from tests.fakes.clock import FakeClock
from tests.fakes.loopback import LoopbackThread
from tests.gateway.harness import GatewayThread, make_settings

SCENARIO = "orders"
REFUSAL = "messages.1.tool_calls.0.function.name: Field required, got <none>"


class MoodyModel(LoopbackThread):
    """An OpenAI chat server whose ``mood`` decides every answer: ``refuse`` (400 naming
    a field, as vLLM refuses a malformed conversation), ``busy`` (503) or ``fine``."""

    def __init__(self) -> None:
        super().__init__()
        self.mood: Literal["refuse", "busy", "fine"] = "fine"
        self.calls = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.calls += 1
        if self.mood == "refuse":
            error = {"message": REFUSAL, "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        if self.mood == "busy":
            error = {"message": "the model is overloaded", "type": "ServiceUnavailable"}
            return web.json_response({"error": error}, status=503)
        reply = {"role": "assistant", "content": "your order ships today"}
        return web.json_response(
            {
                "id": f"chatcmpl-{self.calls}",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5},
            }
        )


class PromptLearner(Learner):
    """Proposes a harness whose system prompt is new (no model involved)."""

    type_name: ClassVar[str] = "prompt"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = LearnerConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        harness = Harness(schema_version=1, system_prompt="Answer about orders briefly.")
        digest = context.artifacts.put_bytes(pack_bundle(Bundle(harness, {})), "harness")
        return LearnerOutput(harness=digest, consumed=[e.record_id for e in context.batch.train])


@dataclass
class Loop:
    """The model, the gateway in front of it and a worker whose gate calls the gateway."""

    model: MoodyModel
    gateway: GatewayThread
    queue: JobQueue
    worker: Worker
    held_out: list[str]
    clock: FakeClock

    def run_job(self) -> Job:
        [job] = self.worker.run_once()
        return job


def _settings(tmp: Path, model_url: str) -> ReefSettings:
    upstream = {"type": "openai", "base_url": model_url, "model": "m", "max_retries": 0}
    return make_settings(
        tmp,
        model_url,
        upstreams={"up": upstream},
        scenarios={SCENARIO: {"upstream": "up", "harness": "managed"}},
    )


def _record(text: str) -> RecordDraft:
    return RecordDraft(
        id=new_id(),
        scenario=SCENARIO,
        session_id=new_id(),
        api="openai.chat",
        request={"model": "m", "messages": [{"role": "user", "content": text}]},
        response={"choices": [{"message": {"role": "assistant", "content": "it ships today"}}]},
        status="ok",
        error=None,
        latency_ms=1.0,
        usage=None,
        release_id=None,
        prompt_hash="sha256:" + "a" * 64,
        content_hash="sha256:" + new_id().replace("-", "").ljust(64, "0")[:64],
        continuation_hash=None,
    )


def _liked(record_id: str) -> FeedbackDraft:
    return FeedbackDraft(
        scenario=SCENARIO,
        record_ids=(record_id,),
        score=1.0,
        feedback=None,
        correction=None,
        metadata={},
        principal=None,
        idempotency_key=None,
    )


@contextmanager
def learning_loop(tmp_path: Path) -> Iterator[Loop]:
    """The running loop: six held-out records with feedback, one release, a worker."""
    with MoodyModel() as model:
        settings = _settings(tmp_path, model.base_url)
        with GatewayThread(settings) as gateway:
            evaluation = settings.evaluation.model_copy(update={"gateway_url": gateway.url})
            worker_settings = settings.model_copy(update={"evaluation": evaluation})
            store, chain = gateway.store, ReleaseChain(gateway.database)
            chain.create(SCENARIO, ReleaseManifest(model=ModelComponent(base="m")), "test", "v1")
            ids = store.write_records([_record(f"where is order {n}?") for n in range(6)])
            for record_id in ids:
                store.add_feedback(_liked(record_id))
            clock = FakeClock()
            queue = JobQueue(gateway.database, clock=clock)
            recipe: dict[str, Any] = {
                "learners": [{"type": "prompt"}],
                # Every record is held out: the gate asks each of them.
                "selection": {"holdout_fraction": 1.0},
                "gate": {"retries": 0, "min_items": 1, "max_tokens": 8, "method": "bootstrap"},
            }
            worker = Worker(
                worker_settings,
                store,
                chain,
                open_artifact_store(settings.artifacts_url()),
                queue=queue,
                evaluations=EvaluationStore(gateway.database),
                registry=LearnerRegistry({"prompt": PromptLearner}, entry_points_too=False),
                recipes={SCENARIO: parse_recipe(recipe)},
            )
            yield Loop(model, gateway, queue, worker, ids, clock)


@pytest.fixture
def loop(tmp_path: Path) -> Iterator[Loop]:
    with learning_loop(tmp_path) as running:
        yield running


def test_a_gate_whose_items_are_refused_fails_the_job_at_once(
    loop: Loop, caplog: pytest.LogCaptureFixture
) -> None:
    loop.model.mood = "refuse"
    loop.queue.enqueue(SCENARIO, "learn", {"trigger": "manual"})
    with caplog.at_level(logging.WARNING, logger="reef.worker"):
        job = loop.run_job()
    assert (job.state, job.attempt) == ("failed", 1)
    assert job.error is not None
    assert job.error.startswith("6 of 6 candidate calls failed (more than 10%): refused 6; ")
    first = job.error.split("first: item ", 1)[1]
    item_id, rest = first.split(" ", 1)
    assert item_id in loop.held_out
    assert rest.startswith("(holdout): gateway answered 400: ")
    assert REFUSAL in rest  # the field to fix
    calls = loop.model.calls
    assert loop.worker.run_once() == []  # nothing left to claim: no second attempt
    assert loop.model.calls == calls
    [line] = [r for r in caplog.records if "not retried" in r.getMessage()]
    assert "refused eval calls will recur" in line.getMessage()
    assert line.exc_info is None  # one line, no traceback, for a failure that will recur


def test_a_gate_that_meets_an_outage_waits_undecided_and_asks_again(loop: Loop) -> None:
    """An outage makes every item void: the job ends with the candidate undecided (not
    failed, not rejected), and the worker asks the void items again once the outage is
    over, without a new job or attempt."""
    loop.model.mood = "busy"
    queued = loop.queue.enqueue(SCENARIO, "learn", {"trigger": "manual"})
    job = loop.run_job()
    assert (job.id, job.state, job.attempt) == (queued.id, "succeeded", 1), job.error
    gate = (job.result or {})["gate"]
    assert gate["action"] == "undecided"
    assert gate["missing"][0] == "answers to the 6 void items (asked again on the next look)"
    chain = ReleaseChain(loop.gateway.database)
    candidate = chain.get_candidate((job.result or {})["candidate_id"])
    assert candidate.state == "evaluating"
    loop.model.mood = "fine"  # the outage is over
    assert loop.worker.run_once() == []  # too soon after the last look: nothing asked
    loop.clock.advance(VOID_RETRY_SECONDS)
    assert loop.worker.run_once() == []
    history = (chain.get_candidate(candidate.id).evidence or {})["gate"]["history"]
    assert (history[0]["verdict"], history[0]["void"]) == ("undecided", 6)
    assert len(history) == 2 and history[1]["void"] == 0
    assert history[1]["verdict"] != "undecided"
    assert loop.queue.get(queued.id).attempt == 1
