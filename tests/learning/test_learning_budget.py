"""Reef's own learning spend under ``learning_budget``: a job whose judge budget runs out
stops with ``budget_exhausted`` and proposes nothing; a training-minutes budget refuses
the next training job until its window rolls; the gate whose eval budget runs out
mid-evaluation answers ``undecided`` and publishes nothing; bad budgets are config
errors. Real parts: a judge upstream on loopback, a real gateway before the oracle
upstream, SQLite, the job queue on an injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import orjson
import pytest
from pydantic import ValidationError

from reef.cli.status import job_cost
from reef.config import ScenarioConfig
from reef.config.spend import LearningBudgetLimit, PriceConfig
from reef.core import SilentProgress
from reef.experience import (
    LEARNING_SPEND,
    LearningBudgetExhaustedError,
    LearningMeter,
    RecordFilter,
)
from reef.jobs import JobQueue
from reef.learning.base import Learner, LearnerConfig, LearnerContext, LearnerOutput
from reef.learning.holdout import build_gate, select_holdout
from reef.learning.recipes import RecipeError, parse_recipe
from reef.learning.worker import Worker
from tests.evaluation.gate_setup import SCENARIO as QUIZ
from tests.evaluation.gate_setup import fact, quiz_world
from tests.fakes.clock import FakeClock
from tests.fakes.judge import JudgeUpstreamThread
from tests.learning.test_undecided import RECIPE as GATED
from tests.learning.test_undecided import corrected_traffic
from tests.learning.test_worker import SCENARIO, World, _draft, open_world, registry

RUBRIC: dict[str, Any] = {
    "rubric": "Names the team that owns the product.",
    "calls_per_pass": 3,
    "lookback_hours": 72,
}


@pytest.fixture
def judge() -> Iterator[JudgeUpstreamThread]:
    with JudgeUpstreamThread(good="T-OPS") as server:
        yield server


@pytest.fixture
def judged_world(tmp_path: Path, judge: JudgeUpstreamThread) -> Iterator[World]:
    world = open_world(f"sqlite:///{tmp_path / 'reef.db'}", tmp_path, judge.base_url)
    yield world
    world.store.close()


def test_a_job_with_a_ten_call_judge_budget_stops_at_ten_calls(
    judged_world: World, judge: JudgeUpstreamThread
) -> None:
    world = judged_world
    world.store.write_records([_draft(f"which team owns part {n}?") for n in range(15)])
    world.clock.advance(1)  # the answers were served before the worker's now
    recipe = {
        "learners": [{"type": "stamp"}],
        "judges": [RUBRIC],
        "learning_budget": [{"window": "day", "purpose": "judge", "calls": 10}],
    }
    worker = world.worker(recipe)
    job = world.queue.enqueue(SCENARIO, "learn", {})
    before = LEARNING_SPEND.snapshot()["calls"].get((SCENARIO, "judge"), 0)
    [done] = worker.run_once()  # the pass grades 3 (calls_per_pass), the job the rest
    assert done.id == job.id and done.state == "succeeded"
    result = done.result or {}
    assert result["outcome"] == "budget_exhausted"
    assert result["budget"] == f"learn:recipe:{SCENARIO}/judge/day"
    assert "calls 10 of 10 spent" in result["reason"] and "resets" in result["reason"]
    assert judge.calls == 10
    # /metrics' reef_learning_calls_total counts every one (the pass's and the job's)
    assert LEARNING_SPEND.snapshot()["calls"][(SCENARIO, "judge")] - before == 10
    cost = result["cost"]
    assert cost["model_calls"] == 7 and cost["by_purpose"]["judge"]["calls"] == 7
    assert cost["unpriced_calls"] == 7  # no price configured: counted, unpriced
    assert cost["tokens"] == 14 and job_cost(result) == "7 calls, 14 tok, unpriced"
    assert done.candidate_id is None and world.chain.candidates(SCENARIO) == []
    calls = world.store.list_records(SCENARIO, RecordFilter(purpose="judge"), None, 50)
    assert len(calls.records) == 10
    # The window is spent: the next pass makes no call; the next day it grades again.
    worker.compute_feedback()
    assert judge.calls == 10
    world.clock.advance(24 * 3600)
    worker.compute_feedback()
    assert judge.calls == 13


def test_a_money_budget_counts_priced_calls_at_their_price(
    judged_world: World, judge: JudgeUpstreamThread
) -> None:
    """Each judge call reports 1 input and 1 output token; at 0.5 money per token
    each costs 1.0, so a scenario's daily money budget of 4 admits four calls."""
    world = judged_world
    world.store.write_records([_draft(f"which team owns part {n}?") for n in range(6)])
    world.clock.advance(1)
    price = PriceConfig(input_per_mtok=500_000, output_per_mtok=500_000)
    upstream = world.settings.upstreams["up"].model_copy(update={"prices": {"m": price}})
    scenario = ScenarioConfig(learning_budget=[{"window": "month", "money": 4.0}])
    world.settings = world.settings.model_copy(
        update={"upstreams": {"up": upstream}, "scenarios": {SCENARIO: scenario}}
    )
    worker = world.worker({"learners": [{"type": "stamp"}], "judges": [RUBRIC]})
    world.queue.enqueue(SCENARIO, "learn", {})
    [done] = worker.run_once()
    result = done.result or {}
    assert result["outcome"] == "budget_exhausted" and judge.calls == 4
    assert result["budget"] == f"learn:scenario:{SCENARIO}/total/month"
    assert "money 4 of 4 spent" in result["reason"]
    assert result["cost"]["money"] == 1.0 and result["cost"]["unpriced_calls"] == 0
    assert job_cost(result) == "1 call, 2 tok, 1.0000"
    # each judge call's record carries its usage and cost, as a served record does
    found = world.store.list_records(SCENARIO, RecordFilter(purpose="judge"), None, 50)
    assert [r.cost for r in found.records] == [1.0] * 4
    assert {(r.price or {}).get("model") for r in found.records} == {"m"}


class EagerLearner(Learner):
    """Reflects three times, shrugging off a failed call as one lost variant (as the
    instructions learner does), and proposes whatever it got."""

    type_name: ClassVar[str] = "eager"
    kind: ClassVar[Literal["harness", "model"]] = "harness"
    config_model: ClassVar[type[LearnerConfig]] = LearnerConfig

    def learn(self, context: LearnerContext) -> LearnerOutput:
        got = []
        for _ in range(3):
            try:
                got.append(context.reflector.reflect([{"role": "user", "content": "rules?"}]))
            except Exception:
                continue
        digest = context.artifacts.put_bytes(orjson.dumps(got), "harness")
        return LearnerOutput(harness=digest, metrics={"variants": len(got)})


def test_a_learner_that_swallows_a_refused_call_proposes_nothing(
    judged_world: World, judge: JudgeUpstreamThread
) -> None:
    world = judged_world
    world.add_experience(2)
    recipe = {
        "learners": [{"type": "eager"}],
        "learning_budget": [{"window": "hour", "purpose": "reflect", "calls": 2}],
    }
    worker = Worker(
        world.settings, world.store, world.chain, world.artifacts, queue=world.queue,
        registry=registry(EagerLearner),
        recipes={SCENARIO: parse_recipe({"gate": {"enabled": False}, **recipe})},
        evaluations=world.worker({"learners": [{"type": "stamp"}]}).evaluations,
    )  # fmt: skip
    world.queue.enqueue(SCENARIO, "learn", {})
    [done] = worker.run_once()
    result = done.result or {}
    assert result["outcome"] == "budget_exhausted", result
    assert result["budget"] == f"learn:recipe:{SCENARIO}/reflect/hour"
    assert judge.calls == 2 and result["cost"]["by_purpose"]["reflect"]["calls"] == 2
    assert done.candidate_id is None and world.chain.candidates(SCENARIO) == []


class TrainConfig(LearnerConfig):
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    minutes: float = 20.0


class ClockworkLearner(Learner):
    """A model learner whose training takes ``minutes`` on the world's clock."""

    type_name: ClassVar[str] = "clockwork"
    kind: ClassVar[Literal["harness", "model"]] = "model"
    config_model: ClassVar[type[LearnerConfig]] = TrainConfig
    world: ClassVar[World]

    def learn(self, context: LearnerContext) -> LearnerOutput:
        config = self.config
        assert isinstance(config, TrainConfig)
        self.world.clock.advance(config.minutes * 60)
        digest = context.artifacts.put_bytes(
            orjson.dumps({"n": len(context.batch.train)}), "adapter"
        )
        return LearnerOutput(adapter=digest, metrics={})


def test_a_training_minutes_budget_refuses_the_next_training_job(judged_world: World) -> None:
    world = judged_world
    ClockworkLearner.world = world
    world.add_experience(3)
    recipe = {
        "learners": [{"type": "clockwork"}],
        "learning_budget": [{"window": "day", "cpu_minutes": 15}],
    }
    worker = Worker(
        world.settings, world.store, world.chain, world.artifacts, queue=world.queue,
        registry=registry(ClockworkLearner),
        recipes={SCENARIO: parse_recipe({"gate": {"enabled": False}, **recipe})},
        evaluations=world.worker({"learners": [{"type": "stamp"}]}).evaluations,
    )  # fmt: skip
    world.queue.enqueue(SCENARIO, "learn", {})
    [first] = worker.run_once()  # admitted below the limit; trains 20 minutes
    assert (first.result or {})["outcome"] == "proposed"
    assert (first.result or {})["cost"]["cpu_minutes"] == 20.0
    assert job_cost(first.result) == "20.0 cpu min"
    world.add_experience(3)
    world.queue.enqueue(SCENARIO, "learn", {})
    [second] = worker.run_once()
    result = second.result or {}
    assert result["outcome"] == "budget_exhausted"
    assert result["budget"] == f"learn:recipe:{SCENARIO}/total/day"
    assert "cpu_minutes 20 of 15 spent" in result["reason"]
    assert second.candidate_id is None and len(world.chain.candidates(SCENARIO)) == 1
    world.clock.advance(24 * 3600)  # a new day: training is admitted again
    world.queue.enqueue(SCENARIO, "learn", {})
    [third] = worker.run_once()
    assert (third.result or {})["outcome"] == "proposed"


@pytest.mark.parametrize("purpose", ["eval", "gate"])
def test_the_gate_is_undecided_when_its_budget_runs_out_mid_evaluation(
    tmp_path: Path, purpose: str
) -> None:
    tight = [{"window": "day", "purpose": purpose, "calls": 7}]
    gate = {**GATED["gate"], "concurrency": 1}
    recipe = parse_recipe({**GATED, "gate": gate, "learning_budget": tight})
    with quiz_world(tmp_path) as world:
        world.publish_directly([])
        head = world.head()
        candidate = world.propose([fact(i) for i in range(40)])
        settings = world.gateway.settings
        evaluation = settings.evaluation.model_copy(update={"gateway_url": world.gateway.url})
        settings = settings.model_copy(update={"evaluation": evaluation})
        clock = FakeClock()
        queue = JobQueue(world.gateway.database, clock=clock)
        worker = Worker(
            settings, world.gateway.store, world.chain, world.artifacts, queue=queue,
            evaluations=world.evaluations, recipes={QUIZ: recipe},
        )  # fmt: skip
        corrected_traffic(world, range(20))
        held = select_holdout(world.gateway.store, world.chain, QUIZ, recipe)
        budget = f"learn:recipe:{QUIZ}/{purpose}/day"

        def gate_with(meter: LearningMeter) -> Any:
            return build_gate(
                settings, world.chain, world.evaluations, world.artifacts, QUIZ, recipe,
                progress=SilentProgress(), meter=meter,
            )  # fmt: skip

        def eval_calls() -> int:
            found = world.gateway.store.list_records(QUIZ, RecordFilter(purpose="eval"), None, 200)
            return len(found.records)

        meter = worker.meter_for(QUIZ, recipe)
        outcome = gate_with(meter).run(candidate.id, held.items, now=queue.now())
        assert outcome.action == "undecided" and outcome.decision is not None
        assert budget in outcome.decision.reasons[0]
        assert outcome.cost["budget_exhausted"] == budget
        assert outcome.cost["spend"]["by_purpose"]["eval"]["calls"] == 7
        assert world.chain.get_candidate(candidate.id).state == "evaluating"
        assert world.head().id == head.id  # never published
        assert eval_calls() == 7
        gate = (world.chain.get_candidate(candidate.id).evidence or {})["gate"]
        assert gate["decision"]["verdict"] == "undecided" and gate["cost"]["spend"]

        # The worker does not ask again inside the spent window; once it resets, it does
        # (and this budget stops that look at 7 calls too).
        [waiting] = worker.resume_undecided()
        assert waiting.reason is None and eval_calls() == 7
        clock.advance(24 * 3600)
        [again] = worker.resume_undecided()
        assert again.reason == "the learning budget's window reset"
        assert again.outcome is not None and again.outcome.action == "undecided"
        assert eval_calls() == 14

        # With room in the budget the same evaluation decides, and says what it cost.
        roomy = [LearningBudgetLimit(window="day", purpose="eval", calls=100)]
        meter = LearningMeter(world.gateway.database, [("recipe:roomy", roomy)], queue.now)
        decided = gate_with(meter).run(candidate.id, held.items, now=queue.now())
        assert decided.action == "published"
        # every answer the gate asked for (both arms and the leak probes) was counted
        assert decided.cost["spend"]["model_calls"] == decided.cost["model_calls"] >= 40


def test_learning_budgets_that_make_no_sense_are_config_errors() -> None:
    with pytest.raises(ValidationError, match="needs calls, tokens, money"):
        LearningBudgetLimit(window="day")
    with pytest.raises(ValidationError, match="training minutes are a budget of purpose total"):
        LearningBudgetLimit(window="day", purpose="judge", cpu_minutes=5)
    with pytest.raises(ValidationError, match="greater than 0"):
        LearningBudgetLimit(window="day", calls=0)
    with pytest.raises(ValidationError, match="purpose"):
        LearningBudgetLimit.model_validate({"window": "day", "purpose": "tutor", "calls": 1})
    twice = [{"window": "day", "calls": 5}, {"window": "day", "money": 1.0}]
    with pytest.raises(RecipeError, match="two total learning budgets for the window 'day'"):
        parse_recipe({"learners": [{"type": "fewshot"}], "learning_budget": twice})
    upside_down = [
        {"window": "hour", "purpose": "eval", "tokens": 900},
        {"window": "day", "purpose": "eval", "tokens": 100},
    ]
    with pytest.raises(
        ValidationError, match=r"the hour eval tokens budget \(900\) exceeds the day"
    ):
        ScenarioConfig(learning_budget=upside_down)
    ok = ScenarioConfig(learning_budget=[{"window": "hour", "purpose": "judge", "calls": 10}])
    assert ok.learning_budget[0].calls == 10


def test_a_teacher_budget_caps_the_teachers_calls_and_no_other_purpose(
    judged_world: World,
) -> None:
    """Distillation charges its teacher's calls to purpose ``teacher``: a recipe's
    teacher cap refuses the call after the last it allows, and counts nothing else."""
    world = judged_world
    recipe = parse_recipe(
        {
            "learners": [{"type": "stamp"}],
            "learning_budget": [{"window": "day", "purpose": "teacher", "calls": 2}],
        }
    )
    meter = world.worker({"learners": [{"type": "stamp"}]}).meter_for(SCENARIO, recipe)
    for _ in range(2):
        meter.admit("teacher")
        meter.charge("teacher", {"prompt_tokens": 3, "completion_tokens": 4}, None)
    meter.admit("judge")  # another purpose is not this budget's
    with pytest.raises(LearningBudgetExhaustedError, match="calls 2 of 2 spent") as spent:
        meter.admit("teacher")
    assert spent.value.budget == f"learn:recipe:{SCENARIO}/teacher/day"
    tally = meter.tally.as_dict()
    assert tally["by_purpose"]["teacher"] == {"calls": 2, "tokens": 14, "money": None}
    assert tally["unpriced_calls"] == 2


def test_a_gate_budget_counts_every_call_of_the_gate_and_no_other(judged_world: World) -> None:
    """Purpose ``gate`` caps what the gate spends, whatever each call's own purpose
    (its answers ``eval``, its episodes, its model-graded scorers' ``judge``); a job's
    judges outside the gate are not its."""
    recipe = parse_recipe(
        {
            "learners": [{"type": "stamp"}],
            "learning_budget": [{"window": "day", "purpose": "gate", "calls": 3}],
        }
    )
    meter = judged_world.worker({"learners": [{"type": "stamp"}]}).meter_for(SCENARIO, recipe)
    usage = {"prompt_tokens": 1, "completion_tokens": 1}
    for _ in range(5):
        meter.admit("judge")  # the job's own judges: not the gate's
        meter.charge("judge", usage, None)
    gate = meter.gate()
    for purpose in ("eval", "episode", "judge"):
        gate.admit(purpose)
        gate.charge(purpose, usage, None)
    with pytest.raises(LearningBudgetExhaustedError, match="calls 3 of 3 spent") as spent:
        gate.admit("eval")
    assert spent.value.budget == f"learn:recipe:{SCENARIO}/gate/day"
    meter.admit("judge")  # outside the gate the budget does not apply
    assert gate.tally.as_dict()["by_purpose"].keys() == {"eval", "episode", "judge"}
    assert meter.tally.as_dict()["model_calls"] == 8  # the gate's calls count in the job's
