"""A training run stops mid-run when the learning budget's training minutes run out:
the worker gives the trainer what the tightest minutes budget has left as its deadline,
the trainer (a real ``sft`` run on tiny-random in a child process) checks it after
every step, and the job ends ``budget_exhausted`` with nothing proposed and the minutes
it trained charged. A budget of a few microseconds trips after the first step, however
fast the machine: no timing is asserted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reef.learning.learners.preference import PreferenceConfig, PreferenceLearner
from reef.learning.learners.sft import SFTLearner
from reef.learning.recipes import parse_recipe
from reef.learning.trainers import TrainingDeadlineError
from reef.learning.trainers.budget import Budget, time_stop
from reef.learning.worker import Worker
from reef.releases import ReleaseChain, open_artifact_store
from tests.learning import test_preference_learner as preference
from tests.learning.test_worker import SCENARIO, World, open_world, registry

# PEFT 0.21 reads a deprecated transformers property while the engine wraps its model.
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*is_gradient_checkpointing. is deprecated:FutureWarning"
)

SFT = {
    "type": "sft",
    "model": "tiny-random",
    "steps": 4,
    "batch_size": 1,
    "threads": 1,
    "device": "cpu",
}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    opened = open_world(f"sqlite:///{tmp_path / 'reef.db'}", tmp_path)
    yield opened
    opened.store.close()


def _worker(world: World, budget: list[dict[str, Any]]) -> Worker:
    recipe = {"gate": {"enabled": False}, "learners": [SFT], "learning_budget": budget}
    return Worker(
        world.settings, world.store, world.chain, world.artifacts, queue=world.queue,
        registry=registry(SFTLearner), recipes={SCENARIO: parse_recipe(recipe)},
        evaluations=world.worker({"learners": [{"type": "stamp"}]}).evaluations,
    )  # fmt: skip


def test_training_stops_after_its_first_step_when_the_minutes_run_out(world: World) -> None:
    world.add_experience(3)
    before = {info.digest for info in world.artifacts.list()}
    # 1e-7 minutes (6 µs) are left: the first step always outlasts them.
    worker = _worker(world, [{"window": "day", "cpu_minutes": 1e-7}])
    world.queue.enqueue(SCENARIO, "learn", {})
    [done] = worker.run_once()
    assert done.state == "succeeded"
    result = done.result or {}
    assert result["outcome"] == "budget_exhausted", result
    assert result["budget"] == f"learn:recipe:{SCENARIO}/total/day"
    assert "cpu_minutes" in result["reason"] and "of 1e-07 spent" in result["reason"]
    training = result["training"]
    assert training["learner"] == "sft"
    assert (training["steps_run"], training["steps_planned"]) == (1, 4)
    # the minutes the loop ran are charged: to the job and to the day's window
    assert training["minutes"] > 0
    recipe = worker.recipe_of(SCENARIO)
    assert recipe is not None
    left = worker.meter_for(SCENARIO, recipe).training_minutes_left("cpu")
    assert left == pytest.approx(1e-7 - training["minutes"], abs=1e-6) and left < 0
    # nothing half-made: no candidate, no adapter stored
    assert done.candidate_id is None and world.chain.candidates(SCENARIO) == []
    assert {info.digest for info in world.artifacts.list()} == before
    # the spent window refuses the next training job before it starts
    world.add_experience(3)
    world.queue.enqueue(SCENARIO, "learn", {})
    [refused] = worker.run_once()
    assert (refused.result or {})["outcome"] == "budget_exhausted"
    assert "training" not in (refused.result or {})


def test_with_minutes_to_spare_the_run_trains_every_step(world: World) -> None:
    world.add_experience(3)
    worker = _worker(world, [{"window": "day", "cpu_minutes": 600}])
    world.queue.enqueue(SCENARIO, "learn", {})
    [done] = worker.run_once()
    result = done.result or {}
    assert result["outcome"] == "proposed", result
    sft = result["metrics"]["0:sft"]
    assert sft["stop_reason"] == "steps" and len(sft["loss_curve"]) == 4


def test_the_preference_trainer_stops_at_the_deadline_and_stores_nothing(
    tmp_path: Path,
) -> None:
    """The same deadline reaches the preference trainer (DPO) through the learner."""
    chain = ReleaseChain.from_url(f"sqlite:///{tmp_path / 'reef.db'}")
    try:
        store = open_artifact_store(tmp_path / "artifacts")
        head = preference.create(chain, "s", None)
        context = preference.context(tmp_path, head, store, preference.TRAIN, [])
        context.training_minutes = 1e-7
        learner = PreferenceLearner(PreferenceConfig(steps=3, batch_size=2, threads=1))
        with pytest.raises(TrainingDeadlineError, match="after 1 of 3 steps") as stopped:
            learner.learn(context)
        assert stopped.value.learner == "preference" and stopped.value.minutes > 0
        assert store.list() == []
    finally:
        chain.close()


def test_the_deadline_comes_before_the_recipes_own_time_cap() -> None:
    both = Budget(max_seconds=10.0, deadline_seconds=5.0)
    assert time_stop(both, 4.0) is None
    assert time_stop(both, 6.0) == "learning_budget"
    assert time_stop(Budget(max_seconds=10.0, deadline_seconds=50.0), 11.0) == "max_seconds"
    assert time_stop(Budget(), 1e9) is None
