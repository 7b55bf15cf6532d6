"""Checking everything each scenario needs before a command starts serving or learning.

``reef serve`` and ``reef worker`` call ``check_scenarios`` right after loading the
configuration, so a missing folder or a typo in a recipe stops the command before
"Reef is ready" with exit code 2, one line per problem naming the setting, e.g.::

    error: scenarios.support.initial_harness: folder harness does not exist (/srv/harness)
    error: scenarios.support.recipe (recipes/s.yaml): learners[0].k: Input should be ...

Checked: ``initial_harness`` (a folder holding a valid bundle) where the gateway serves;
``recipe`` (readable, valid, learners' settings included), the suites its gate names,
the environments it names (type known, tasks file present) and the upstreams it names
(judges, the gate's scorer, learners' reflector) where a worker learns. A scenario's own
``upstream`` is checked with the rest of the configuration when it is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.config import ConfigError, ReefSettings
from reef.core.errors import ReefError

if TYPE_CHECKING:
    from reef.learning import Recipe


def check_scenarios(settings: ReefSettings, *, serving: bool, learning: bool) -> None:
    """Raise ``ConfigError`` (exit 2) listing every problem, one line each, of what the
    configured scenarios need: what the gateway reads when ``serving``, what the worker
    reads when ``learning``."""
    problems = scenario_problems(settings, serving=serving, learning=learning)
    if problems:
        # ``reef.cli.exits`` prints "error: " before the first; the others get their own.
        raise ConfigError("\nerror: ".join(problems))


def scenario_problems(settings: ReefSettings, *, serving: bool, learning: bool) -> list[str]:
    """Every problem found, one line each, starting with the setting's path."""
    problems: list[str] = []
    for name, scenario in settings.scenarios.items():
        if serving and scenario.initial_harness is not None:
            problems += _harness_problems(
                f"scenarios.{name}.initial_harness", scenario.initial_harness
            )
        if learning and scenario.recipe is not None:
            problems += _recipe_problems(settings, name, scenario.recipe)
    return problems


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _where(path: Path) -> str:
    """``path`` as configured, and where that is when it is relative."""
    return str(path) if path.is_absolute() else f"{path} ({path.resolve()})"


def _harness_problems(setting: str, folder: Path) -> list[str]:
    from reef.harness import load_bundle

    if not folder.exists():
        return [f"{setting}: folder {_where(folder)} does not exist"]
    if not folder.is_dir():
        return [f"{setting}: {_where(folder)} is not a folder (a harness bundle is a folder)"]
    try:
        load_bundle(folder)
    except ReefError as exc:
        return [f"{setting}: {_one_line(exc.message)}"]
    return []


def _recipe_problems(settings: ReefSettings, scenario: str, path: Path) -> list[str]:
    from reef.learning import RecipeError, load_recipe, shadow_judge_problems

    setting = f"scenarios.{scenario}.recipe"

    if not path.exists():
        return [f"{setting}: file {_where(path)} does not exist"]
    if not path.is_file():
        return [f"{setting}: {_where(path)} is not a file"]
    try:
        recipe = load_recipe(path)
    except RecipeError as exc:
        return [f"{setting} ({path}): {line}" for line in recipe_error_lines(exc.message)]
    problems = [*_recipe_references(settings, recipe)]
    problems += shadow_judge_problems(settings, scenario, recipe)
    return [f"{setting} ({path}): {problem}" for problem in problems]


def recipe_error_lines(message: str) -> list[str]:
    """A ``RecipeError``'s message as one line per problem: the problems listed under
    "invalid recipe …:", or the whole message on one line."""
    lines = message.splitlines()
    if not (len(lines) > 1 and lines[0].startswith("invalid recipe")):
        return [_one_line(message)]
    found = []
    listed = [line.strip().replace("Value error, ", "") for line in lines[1:] if line.strip()]
    for index, line in enumerate(listed):
        # a nested check's own header ("invalid settings for ... at learners[0]:"): the
        # lines after it name their full path already
        if line.endswith(":") and index + 1 < len(listed):
            continue
        found.append(line)
    return found


def _recipe_references(settings: ReefSettings, recipe: Recipe) -> Iterator[str]:
    """What a valid recipe names that must exist: suites, environments, upstreams."""
    for index, suite in enumerate(recipe.gate.suites):
        yield from _suite_problems(f"gate.suites[{index}]", Path(suite))
    for where, environment in _environments(recipe):
        yield from _environment_problems(where, environment)
    for where, upstream in _upstreams(recipe):
        if upstream is not None and upstream not in settings.upstreams:
            yield (
                f"{where}: unknown upstream {upstream!r}; configured upstreams: "
                f"{sorted(settings.upstreams)}"
            )


def _environments(recipe: Recipe) -> list[tuple[str, Mapping[str, Any]]]:
    """The environment specs a recipe names, with where."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    if recipe.gate.episodes is not None:
        found.append(("gate.episodes.environment", recipe.gate.episodes.environment))
    for index, spec in enumerate(recipe.learners):
        environment = spec.settings().get("environment")
        if isinstance(environment, Mapping):
            found.append((f"learners[{index}].environment", environment))
    return found


def _upstreams(recipe: Recipe) -> list[tuple[str, Any]]:
    """The upstream names a recipe gives (None where it leaves the default), with where."""
    found: list[tuple[str, Any]] = [("gate.scorer.upstream", recipe.gate.scorer.get("upstream"))]
    for index, spec in enumerate(recipe.learners):
        reflector = spec.settings().get("reflector_upstream")
        found.append((f"learners[{index}].reflector_upstream", reflector))
    found += [(f"judges[{i}].upstream", judge.upstream) for i, judge in enumerate(recipe.judges)]
    return found


def _environment_problems(where: str, environment: Mapping[str, Any]) -> list[str]:
    from reef.environments import EnvironmentRegistry

    try:
        EnvironmentRegistry().check(environment, where)
    except ReefError as exc:
        return [_one_line(exc.message)]
    tasks = environment.get("tasks")
    if isinstance(tasks, str) and not Path(tasks).exists():
        return [f"{where}.tasks: file {tasks} does not exist"]
    return []


def _suite_problems(where: str, path: Path) -> list[str]:
    from reef.evaluation import load_suite

    if not path.is_file():
        return [f"{where}: file {path} does not exist"]
    try:
        load_suite(path)
    except ReefError as exc:  # SuiteError: the message names the file and item
        return [f"{where}: {_one_line(exc.message)}"]
    return []
