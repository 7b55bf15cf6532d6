"""Recipes: when a scenario learns (triggers), from what (selection), how (learners), and
what the gate and publishing do with the result. One YAML file per scenario, named by
``scenarios.<name>.recipe`` in ``reef.yaml``.

```yaml
# reef worker -c reef.yaml   (with scenarios.support.recipe: examples/support-fewshot.yaml)
schema_version: 1
trigger:
  - {type: min_new_feedback, count: 20}
  - {type: max_interval_seconds, seconds: 3600}
selection: {min_score: 0.5}
learners:
  - {type: fewshot, k: 4}
on_stale: evaluate
publish: review
```

Every key is checked: an unknown one is an error naming it and the keys allowed there;
each learner's settings are checked by that learner's own ``config_model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reef.config.spend import LearningBudgetLimit, check_learning_limits
from reef.core.errors import InvalidInputError
from reef.core.validation import problem_lines
from reef.evaluation import GateConfig
from reef.learning.base import Learner
from reef.learning.judges import JudgeConfig
from reef.learning.registry import LearnerRegistry
from reef.learning.selection import SelectionConfig
from reef.learning.signals import SignalsConfig


class RecipeError(InvalidInputError):
    """A recipe file is missing, not YAML, or invalid; the message names each bad key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ManualTrigger(_Strict):
    """Learn only when asked (``reef learn``, ``POST /reef/scenarios/{s}/learn``)."""

    type: Literal["manual"] = "manual"


class MinNewFeedbackTrigger(_Strict):
    """Learn once ``count`` feedback items arrived since the scenario's last job."""

    type: Literal["min_new_feedback"]
    count: int = Field(ge=1, description="Feedback items needed since the last job.")


class MaxIntervalTrigger(_Strict):
    """Learn when ``seconds`` passed since the scenario's last job (or it never had one)."""

    type: Literal["max_interval_seconds"]
    seconds: float = Field(gt=0, description="Longest time between two jobs.")


Trigger = Annotated[
    ManualTrigger | MinNewFeedbackTrigger | MaxIntervalTrigger, Field(discriminator="type")
]


class LearnerSpec(BaseModel):
    """One learner of a recipe: ``type`` picks the class (``reef.learners`` entry point);
    every other key is that learner's setting, checked by its ``config_model``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = Field(min_length=1, description="Registered learner type, e.g. fewshot, sft.")

    def settings(self) -> dict[str, Any]:
        """The learner's own settings (every key but ``type``)."""
        return dict(self.model_extra or {})


def _manual_only() -> list[ManualTrigger | MinNewFeedbackTrigger | MaxIntervalTrigger]:
    return [ManualTrigger()]


class Recipe(_Strict):
    """A scenario's learning recipe."""

    schema_version: Literal[1] = 1
    name: str | None = Field(
        default=None, description="Recorded in candidate manifests; default: the file's stem."
    )
    trigger: list[Trigger] = Field(
        default_factory=_manual_only,
        description="When to learn: one trigger or a list; any trigger that fires starts a job.",
    )
    selection: SelectionConfig = Field(
        default_factory=SelectionConfig, description="Which experience the learners get."
    )
    learners: list[LearnerSpec] = Field(
        min_length=1,
        description="Learners run in order; one job proposes one candidate holding every "
        "component they produce (e.g. a harness and an adapter).",
    )
    gate: GateConfig = Field(
        default_factory=GateConfig,
        description="The evaluation gate: suites, scorer, decision rule, safety, canary "
        "(docs/evaluation.md).",
    )
    signals: SignalsConfig = Field(
        default_factory=lambda: SignalsConfig(enabled=()),
        description="Conversation signals written as feedback as records arrive "
        "(source signal:<name>; docs/learning.md#feedback-without-a-grader); none unless "
        "`enabled` names them.",
    )
    judges: list[JudgeConfig] = Field(
        default_factory=list,
        description="LLM judges grading served answers as feedback (source judge:<name>; "
        "docs/learning.md#feedback-without-a-grader).",
    )
    learning_budget: list[LearningBudgetLimit] = Field(
        default_factory=list,
        description="Caps on what this recipe's jobs and gates spend, per window: model "
        "calls, tokens and money by purpose (judge, reflect, eval, episode, teacher, total) "
        "and training minutes (docs/costs.md#reefs-own-spending).",
    )
    on_stale: Literal["evaluate", "drop"] = Field(
        default="evaluate",
        description="If the head moved while the job ran: propose anyway (the gate compares "
        "against the new head) or drop the result.",
    )
    publish: Literal["auto", "review", "canary"] = Field(
        default="review",
        description="auto: a candidate that passes the gate is published; review: it waits "
        "for a person to promote it; canary: it serves gate.canary.fraction of live traffic "
        "until live feedback promotes or abandons it.",
    )

    @field_validator("trigger", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("judges")
    @classmethod
    def _distinct_judges(cls, judges: list[JudgeConfig]) -> list[JudgeConfig]:
        names = [judge.name for judge in judges]
        if len(set(names)) != len(names):
            raise ValueError(f"judges need distinct names, got {names}")
        return judges

    @field_validator("learning_budget")
    @classmethod
    def _consistent_budget(cls, limits: list[LearningBudgetLimit]) -> list[LearningBudgetLimit]:
        check_learning_limits("learning_budget", limits)
        return limits

    def triggers(self) -> list[ManualTrigger | MinNewFeedbackTrigger | MaxIntervalTrigger]:
        """The triggers (a single ``trigger:`` mapping becomes a list of one)."""
        return list(self.trigger)

    def build_learners(self, registry: LearnerRegistry) -> list[Learner]:
        """One learner instance per entry, settings validated; raises ``RecipeError``."""
        try:
            return [
                registry.build(spec.type, spec.settings(), f"learners[{index}]")
                for index, spec in enumerate(self.learners)
            ]
        except InvalidInputError as error:
            raise RecipeError(error.message) from error


def format_recipe_error(error: ValidationError, source: str) -> str:
    """One line per problem, naming the dotted key; unknown keys list the allowed ones."""
    return "\n".join(
        [f"invalid recipe {source}:", *(f"  {p}" for p in problem_lines(error, Recipe))]
    )


def parse_recipe(
    data: Any, source: str = "<recipe>", registry: LearnerRegistry | None = None
) -> Recipe:
    """Validate recipe data (a mapping, as read from YAML). With ``registry`` the
    learners' settings are validated too. Raises ``RecipeError``."""
    if not isinstance(data, dict):
        raise RecipeError(f"invalid recipe {source}: the top level must be a mapping")
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as error:
        raise RecipeError(format_recipe_error(error, source)) from error
    if registry is not None:
        recipe.build_learners(registry)
    return recipe


def load_recipe(path: Path, registry: LearnerRegistry | None = None) -> Recipe:
    """Read and validate a recipe file; ``name`` defaults to the file's stem. Learner
    settings are validated against ``registry`` (default: the entry points)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise RecipeError(f"cannot read recipe {path}: {error.strerror or error}") from error
    except yaml.YAMLError as error:
        raise RecipeError(f"recipe {path} is not valid YAML: {error}") from error
    recipe = parse_recipe(data, str(path), registry or LearnerRegistry())
    if recipe.name is None:
        recipe = recipe.model_copy(update={"name": path.stem})
    # Suite files are named relative to the recipe.
    suites = [str((path.parent / suite).resolve()) for suite in recipe.gate.suites]
    if suites != recipe.gate.suites:
        gate = recipe.gate.model_copy(update={"suites": suites})
        recipe = recipe.model_copy(update={"gate": gate})
    # So are the tasks files of environments: gate.episodes' and the learners'.
    episodes = recipe.gate.episodes
    if episodes is not None:
        environment = _tasks_resolved(episodes.environment, path.parent)
        gate = recipe.gate.model_copy(
            update={"episodes": episodes.model_copy(update={"environment": environment})}
        )
        recipe = recipe.model_copy(update={"gate": gate})
    learners = []
    for spec in recipe.learners:
        settings = spec.settings()
        learner_environment = settings.get("environment")
        if isinstance(learner_environment, dict):
            settings["environment"] = _tasks_resolved(learner_environment, path.parent)
        learners.append(LearnerSpec(type=spec.type, **settings))
    return recipe.model_copy(update={"learners": learners})


def _tasks_resolved(environment: dict[str, Any], directory: Path) -> dict[str, Any]:
    """An environment spec with a relative ``tasks:`` path resolved under ``directory``."""
    tasks = environment.get("tasks")
    if isinstance(tasks, str) and not Path(tasks).is_absolute():
        return {**environment, "tasks": str((directory / tasks).resolve())}
    return environment
