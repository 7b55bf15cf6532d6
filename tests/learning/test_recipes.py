"""Recipe files: parsing, errors that name the key, learner registry, and the examples."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from reef.evaluation.config import GateConfig
from reef.learning.recipes import (
    MaxIntervalTrigger,
    MinNewFeedbackTrigger,
    Recipe,
    RecipeError,
    load_recipe,
    parse_recipe,
)
from reef.learning.registry import LEARNER_GROUP, LearnerRegistry, UnknownLearnerError
from tests.learning.test_worker import StampLearner, registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_defaults_and_trigger_list() -> None:
    recipe = parse_recipe(
        {
            "trigger": [
                {"type": "min_new_feedback", "count": 5},
                {"type": "max_interval_seconds", "seconds": 60},
            ],
            "learners": [{"type": "stamp", "seconds": 0.5}],
        },
        registry=registry(),
    )
    assert recipe.triggers() == [
        MinNewFeedbackTrigger(type="min_new_feedback", count=5),
        MaxIntervalTrigger(type="max_interval_seconds", seconds=60),
    ]
    assert (recipe.schema_version, recipe.on_stale, recipe.publish) == (1, "evaluate", "review")
    assert recipe.gate == GateConfig() and recipe.gate.enabled
    assert recipe.learners[0].settings() == {"seconds": 0.5}
    [learner] = recipe.build_learners(registry())
    assert isinstance(learner, StampLearner) and learner.config.seconds == 0.5  # type: ignore[attr-defined]
    assert parse_recipe({"learners": [{"type": "stamp"}]}).triggers()[0].type == "manual"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"learners": [{"type": "stamp"}], "triger": {}},
            "unknown key 'triger'; allowed keys here:",
        ),
        (
            {"learners": [{"type": "stamp"}], "selection": {"min_scor": 1}},
            "unknown key 'selection.min_scor'; allowed keys here: ",
        ),
        ({"learners": []}, "learners: List should have at least 1 item"),
        ({"learners": [{"type": "stamp"}], "on_stale": "keep"}, "on_stale: Input should be"),
        (
            {"learners": [{"type": "stamp"}], "trigger": {"type": "min_new_feedback"}},
            "trigger[0].min_new_feedback.count: Field required",
        ),
        (
            {"learners": [{"type": "stamp"}], "trigger": {"type": "hourly"}},
            "does not match any of the expected tags",
        ),
        ({"learners": [{"type": "nope"}]}, "unknown learner type 'nope'; known types: stamp"),
        (
            {"learners": [{"type": "stamp", "secnds": 1}]},
            "unknown key 'learners[0].secnds'; allowed keys here: fail, output, reflect, "
            "reflector_model, reflector_upstream, seconds, type",
        ),
        (
            {"learners": [{"type": "stamp"}, {"type": "stamp", "seconds": "slow"}]},
            "learners[1].seconds: Input should be a valid number",
        ),
        ([1, 2], "the top level must be a mapping"),
    ],
)
def test_errors_name_the_key(data: object, message: str) -> None:
    with pytest.raises(RecipeError) as caught:
        parse_recipe(data, "r.yaml", registry=registry())
    assert message in str(caught.value)


def test_load_recipe_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "billing.yaml"
    path.write_text("learners:\n  - {type: stamp}\npublish: auto\n")
    recipe = load_recipe(path, registry())
    assert (recipe.name, recipe.publish) == ("billing", "auto")
    path.write_text("learners: [\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe(path, registry())
    with pytest.raises(RecipeError, match="cannot read recipe"):
        load_recipe(tmp_path / "missing.yaml", registry())


def test_registry_lists_the_built_ins_from_entry_points() -> None:
    known = LearnerRegistry().known()
    assert {"fewshot", "instructions", "skills", "sft"} <= set(known), LEARNER_GROUP
    with pytest.raises(UnknownLearnerError, match=r"known types: .*fewshot"):
        LearnerRegistry().get("nope")


@pytest.mark.parametrize("name", ["support-fewshot.yaml", "support-sft.yaml"])
def test_examples_parse_and_open_with_their_command(name: str) -> None:
    path = EXAMPLES / name
    first_line = path.read_text(encoding="utf-8").splitlines()[0]
    assert first_line.startswith("# reef ") and f"--recipe examples/{name}" in first_line
    recipe = parse_recipe(yaml.safe_load(path.read_text(encoding="utf-8")), name)
    assert isinstance(recipe, Recipe)
    real = LearnerRegistry()
    for index, spec in enumerate(recipe.learners):
        if importlib.util.find_spec(f"reef.learning.learners.{spec.type}") is not None:
            real.build(spec.type, spec.settings(), f"learners[{index}]")  # settings fit


def test_gate_settings_are_checked_and_suites_resolve_next_to_the_recipe(
    tmp_path: Path,
) -> None:
    path = tmp_path / "recipes" / "triage.yaml"
    path.parent.mkdir()
    path.write_text(
        "learners: [{type: fewshot}]\npublish: canary\n"
        "gate: {suites: [evals/triage.jsonl], min_items: 5, canary: {fraction: 0.2}}\n"
    )
    recipe = load_recipe(path)
    assert recipe.publish == "canary"
    assert recipe.gate.min_items == 5 and recipe.gate.canary.fraction == 0.2
    assert recipe.gate.suites == [str(tmp_path / "recipes" / "evals" / "triage.jsonl")]
    with pytest.raises(RecipeError) as info:
        parse_recipe({"learners": [{"type": "fewshot"}], "gate": {"min_itmes": 5}})
    assert "unknown key 'gate.min_itmes'" in info.value.message
    assert "min_items" in info.value.message


def test_gate_episodes_tasks_resolve_next_to_the_recipe_and_bad_specs_are_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "recipes" / "agent.yaml"
    path.parent.mkdir()
    path.write_text(
        "learners: [{type: fewshot}]\n"
        "gate: {episodes: {environment: {type: python, toolset: orders, tasks: t.jsonl},"
        " repeats: 3}}\n"
    )
    episodes = load_recipe(path).gate.episodes
    assert episodes is not None and episodes.repeats == 3
    assert episodes.environment["tasks"] == str(tmp_path / "recipes" / "t.jsonl")
    with pytest.raises(RecipeError) as info:
        parse_recipe(
            {
                "learners": [{"type": "fewshot"}],
                "gate": {"episodes": {"environment": {"type": "x"}}},
            }
        )
    assert "unknown environment type 'x'" in info.value.message


def test_an_rl_learners_environment_tasks_resolve_next_to_the_recipe(tmp_path: Path) -> None:
    path = tmp_path / "recipes" / "agent.yaml"
    path.parent.mkdir()
    path.write_text(
        "learners:\n"
        "  - type: rl\n"
        "    environment: {type: python, toolset: orders, tasks: tasks/train.jsonl}\n"
        "    group_size: 4\n"
        "  - {type: rl, environment: {type: python, toolset: orders, tasks: /abs/t.jsonl}}\n"
    )
    recipe = load_recipe(path)
    first, second = (spec.settings() for spec in recipe.learners)
    assert first["environment"]["tasks"] == str(tmp_path / "recipes" / "tasks" / "train.jsonl")
    assert first["group_size"] == 4 and second["environment"]["tasks"] == "/abs/t.jsonl"
    with pytest.raises(RecipeError) as info:
        parse_recipe(
            {"learners": [{"type": "rl", "environment": {"type": "python"}}]},
            registry=LearnerRegistry(),
        )
    assert "toolset" in info.value.message and "learners[0]" in info.value.message
