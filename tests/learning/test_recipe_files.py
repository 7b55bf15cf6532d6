"""A recipe edited into a broken state while the worker runs is logged once per change of
the file, not once per pass, and leaves the other scenarios learning."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.config import ReefSettings, ScenarioConfig, StoreConfig, UpstreamConfig
from reef.evaluation import EvaluationStore
from reef.learning.recipes import RecipeError
from reef.learning.worker import Worker
from tests.learning.test_worker import World, open_world, registry

GOOD = "trigger: {type: max_interval_seconds, seconds: 60}\nlearners: [{type: stamp}]\n"
TYPO = "trigger: {type: max_interval_seconds, seconds: 60}\nlerners: [{type: stamp}]\n"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = open_world(f"sqlite:///{tmp_path / 'reef.db'}", tmp_path)
    yield world
    world.store.close()


def _worker(world: World, tmp_path: Path) -> Worker:
    """A worker for ``support`` (recipe ``support.yaml``) and ``billing`` (a good one)."""
    (tmp_path / "billing.yaml").write_text(GOOD, encoding="utf-8")
    settings = ReefSettings(
        home=world.settings.home,
        store=StoreConfig(url=world.settings.store_url()),
        upstreams={"up": UpstreamConfig(type="openai", base_url="http://127.0.0.1:9/v1")},
        scenarios={
            "support": ScenarioConfig(recipe=tmp_path / "support.yaml"),
            "billing": ScenarioConfig(recipe=tmp_path / "billing.yaml"),
        },
    )
    return Worker(
        settings,
        world.store,
        world.chain,
        world.artifacts,
        registry=registry(),
        queue=world.queue,
        evaluations=EvaluationStore(world.store.database),
    )


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "reef.worker" and r.levelno == logging.WARNING
    ]


def _passes(worker: Worker, count: int) -> None:
    """``count`` worker passes' recipe reads, as ``run_forever`` makes one per poll."""
    for _ in range(count):
        worker.check_triggers()


def test_a_broken_recipe_is_logged_once_per_change(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recipe = tmp_path / "support.yaml"
    worker = _worker(world, tmp_path)
    caplog.set_level(logging.INFO, logger="reef.worker")

    _passes(worker, 5)  # the file does not exist
    [missing] = _warnings(caplog)
    assert "scenarios.support.recipe" in missing and str(recipe) in missing, missing
    # the other scenario still learns: its trigger fired on the first pass
    assert world.queue.last_job("billing") is not None
    assert world.queue.last_job("support") is None

    recipe.write_text(TYPO, encoding="utf-8")  # the file appears, with a typo
    _passes(worker, 5)
    assert len(_warnings(caplog)) == 2
    assert "unknown key 'lerners'" in _warnings(caplog)[1]

    recipe.write_text(TYPO, encoding="utf-8")  # written again, same content: no news
    _passes(worker, 3)
    assert len(_warnings(caplog)) == 2

    recipe.write_text(GOOD, encoding="utf-8")  # fixed
    _passes(worker, 1)
    assert "support" in worker.recipes()
    assert any("valid again" in r.getMessage() for r in caplog.records)
    assert world.queue.last_job("support") is not None

    recipe.write_text(TYPO, encoding="utf-8")  # broken again: said again, once
    _passes(worker, 3)
    assert len(_warnings(caplog)) == 3


def test_a_job_of_a_scenario_whose_recipe_broke_fails_with_the_recipe_error(
    world: World, tmp_path: Path
) -> None:
    (tmp_path / "support.yaml").write_text(TYPO, encoding="utf-8")
    worker = _worker(world, tmp_path)
    with pytest.raises(RecipeError, match="unknown key 'lerners'"):
        worker.recipe_of("support")
    assert worker.recipe_of("billing") is not None
    assert worker.recipe_of("nothing-configured") is None
