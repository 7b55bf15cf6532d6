"""Training budgets in terms of the data: steps from epochs, the validation split, the
learning-rate schedule, early stopping and the convergence report."""

from __future__ import annotations

import random

import pytest

from reef.learning.trainers.budget import (
    Budget,
    EarlyStopping,
    batch_plan,
    eval_interval,
    fitted,
    known,
    lr_factor,
    planned_steps,
    split_validation,
    stop_report,
)


def test_steps_follow_the_data() -> None:
    budget = Budget(epochs=5)
    assert planned_steps(240, 8, budget) == 150
    assert planned_steps(480, 8, budget) == 300  # twice the feedback, twice the passes
    assert planned_steps(7, 8, budget) == 5  # a partial batch is still a step
    assert planned_steps(240, 8, Budget(epochs=0.5)) == 15
    assert planned_steps(240, 8, Budget(epochs=5, max_steps=100)) == 100
    assert planned_steps(240, 8, Budget(steps=30, max_steps=10)) == 30  # exact wins


def test_the_validation_split_is_seeded_disjoint_and_only_for_enough_data() -> None:
    budget = Budget(validation_fraction=0.1, validation_min=4, validation_from=20)
    train, val = split_validation(100, budget, random.Random(0))
    assert len(val) == 10 and len(train) == 90
    assert set(train).isdisjoint(val) and set(train) | set(val) == set(range(100))
    assert split_validation(100, budget, random.Random(0)) == (train, val)
    assert split_validation(100, budget, random.Random(1)) != (train, val)
    assert len(split_validation(30, budget, random.Random(0))[1]) == 4  # validation_min
    assert split_validation(19, budget, random.Random(0)) == (list(range(19)), [])
    assert split_validation(100, Budget(steps=10), random.Random(0))[1] == []


def test_every_example_is_seen_once_per_epoch() -> None:
    plan = batch_plan(list(range(10)), 4, 6, random.Random(3))
    assert [len(batch) for batch in plan] == [4, 4, 2, 4, 4, 2]
    first, second = plan[:3], plan[3:]
    assert sorted(i for batch in first for i in batch) == list(range(10))
    assert sorted(i for batch in second for i in batch) == list(range(10))
    assert first != second  # reshuffled


def test_warmup_then_cosine_decay_to_the_floor() -> None:
    budget = Budget(warmup_fraction=0.1, schedule="cosine", min_lr_fraction=0.1)
    factors = [lr_factor(step, 100, budget) for step in range(100)]
    assert factors[0] == pytest.approx(1 / 11)
    assert factors[:10] == sorted(factors[:10])  # rising
    assert factors[10] == pytest.approx(1.0)
    assert factors[10:] == sorted(factors[10:], reverse=True)  # falling
    assert factors[-1] == pytest.approx(0.1)
    linear = Budget(warmup_fraction=0.0, schedule="linear", min_lr_fraction=0.0)
    assert lr_factor(50, 101, linear) == pytest.approx(0.5)
    assert {
        lr_factor(s, 10, Budget(schedule="constant", warmup_fraction=0)) for s in range(10)
    } == {1.0}


def test_early_stopping_waits_for_patience_and_remembers_the_best() -> None:
    stopper = EarlyStopping(Budget(patience=2, min_delta=0.01))
    assert stopper.update(10, 2.0)
    assert stopper.update(20, 1.0)
    # The lowest yet (its weights are kept), but less than 1% better: patience runs on.
    assert stopper.update(30, 0.995)
    assert not stopper.should_stop
    assert not stopper.update(40, 1.2)
    assert stopper.should_stop
    assert (stopper.best, stopper.best_step) == (0.995, 30)
    report = stop_report("early_stopped", stopper, 40, 100)
    assert report["stop_reason"] == "early_stopped" and report["undertrained"] is False
    assert report["val_curve"] == [[10, 2.0], [20, 1.0], [30, 0.995], [40, 1.2]]
    assert report["best_step"] == 30


def test_a_run_cut_while_validation_still_falls_is_undertrained() -> None:
    stopper = EarlyStopping(Budget())
    for step, loss in [(5, 3.0), (10, 2.0), (15, 1.5)]:
        stopper.update(step, loss)
    assert stop_report("max_seconds", stopper, 15, 40)["undertrained"] is True
    assert stop_report("completed", stopper, 15, 15)["undertrained"] is True
    flat = EarlyStopping(Budget())
    for step, loss in [(5, 1.0), (10, 1.0)]:
        flat.update(step, loss)
    assert stop_report("completed", flat, 10, 10)["undertrained"] is False
    assert stop_report("steps", EarlyStopping(Budget()), 10, 10)["undertrained"] is None


def test_validation_runs_twice_per_epoch_by_default() -> None:
    assert eval_interval(80, 8, Budget()) == 5
    assert eval_interval(8, 8, Budget()) == 1
    assert eval_interval(80, 8, Budget(eval_every=3)) == 3


def test_a_run_is_fitted_when_its_last_window_of_losses_is_at_the_floor() -> None:
    budget = Budget(fitted_loss=0.01, fitted_window=4)
    assert not fitted(budget, [0.0, 0.0, 0.0])  # not a full window yet
    assert fitted(budget, [0.9, 0.5, 0.0, 0.01, 0.02, 0.01])  # last four average 0.01
    assert not fitted(budget, [0.0, 0.0, 0.0, 0.05])  # one step still learning
    assert not fitted(Budget(fitted_window=4), [0.0] * 8)  # off by default
    # not before every example was seen once: 6 steps per epoch here
    assert not fitted(budget, [0.0] * 5, epoch_steps=6)
    assert fitted(budget, [0.0] * 6, epoch_steps=6)
    assert not fitted(Budget(fitted_loss=0.01, fitted_window=4, steps=10), [0.0] * 8)
    with pytest.raises(ValueError, match="fitted_loss"):
        Budget(fitted_loss=-1.0)


def test_a_run_knew_its_examples_when_its_first_pass_was_at_the_floor() -> None:
    budget = Budget(known_loss=0.05)
    # decided at the end of the first pass (4 steps here), on that pass's mean
    assert not known(budget, [0.0, 0.0, 0.0], epoch_steps=4)
    assert known(budget, [0.1, 0.05, 0.05, 0.0], epoch_steps=4)  # mean 0.05
    assert not known(budget, [0.9, 0.02, 0.0, 0.0], epoch_steps=4)  # one batch to learn
    # only then: a run that was learning in its first pass makes its epochs
    assert not known(budget, [0.9, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], epoch_steps=4)
    assert not known(budget, [0.0] * 5, epoch_steps=4)
    assert not known(Budget(), [0.0] * 4, epoch_steps=4)  # off by default
    assert not known(Budget(known_loss=0.05, steps=10), [0.0] * 4, epoch_steps=4)
    with pytest.raises(ValueError, match="known_loss"):
        Budget(known_loss=-1.0)
