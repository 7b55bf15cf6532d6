"""``RecipeFiles``: the configured recipe files, read again on every worker pass (an
edit takes effect without a restart), with a failure logged once per change.

A recipe that cannot be used (missing, unreadable, not YAML, an unknown key) leaves its
scenario without learning until it is fixed; the worker says so once, and again only
when the file's content or the error changes, not on every pass. ``reef serve`` and
``reef worker`` check every recipe before they start (``reef.cli.preflight``): this is
for a recipe edited while they run.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from reef.config import ReefSettings
from reef.evaluation import judge_arm_overlap
from reef.learning.recipes import Recipe, RecipeError, load_recipe
from reef.learning.registry import LearnerRegistry

log = logging.getLogger("reef.worker")


def file_fingerprint(path: Path) -> str:
    """The sha256 of ``path``'s content, or why it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        return f"unreadable: {error.strerror or error}"


class RecipeFiles:
    """The recipes named by ``scenarios.<s>.recipe``, loaded with ``registry``."""

    def __init__(self, settings: ReefSettings, registry: LearnerRegistry) -> None:
        self.settings = settings
        self.registry = registry
        # per scenario, the (file fingerprint, error) last logged
        self._failures: dict[str, tuple[str, str]] = {}

    def load_all(self) -> dict[str, Recipe]:
        """Every configured recipe that loads; those that fail are left out (and logged
        once per change)."""
        found: dict[str, Recipe] = {}
        for name in self.settings.scenarios:
            try:
                recipe = self.load(name)
            except RecipeError:
                continue
            if recipe is not None:
                found[name] = recipe
        return found

    def load(self, scenario: str) -> Recipe | None:
        """The scenario's recipe, None when it names none. Raises ``RecipeError`` for
        one that cannot be used, logged as a warning the first time for this content of
        the file and this error."""
        path = self.settings.scenario(scenario).recipe
        if path is None:
            return None
        try:
            recipe = load_recipe(path, self.registry)
            problems = shadow_judge_problems(self.settings, scenario, recipe)
            if problems:
                raise RecipeError(f"invalid recipe {path}: {'; '.join(problems)}")
        except RecipeError as error:
            self._failed(scenario, path, error)
            raise
        if self._failures.pop(scenario, None) is not None:
            log.info("scenario %r: recipe %s is valid again; the scenario learns", scenario, path)
        return recipe

    def _failed(self, scenario: str, path: Path, error: RecipeError) -> None:
        seen = (file_fingerprint(path), error.message)
        if self._failures.get(scenario) == seen:
            return
        self._failures[scenario] = seen
        log.warning(
            "scenario %r does not learn until scenarios.%s.recipe is fixed (logged again "
            "only when the file or the error changes): %s",
            scenario,
            scenario,
            " ".join(error.message.split()),
        )


def shadow_judge_problems(settings: ReefSettings, scenario: str, recipe: Recipe) -> list[str]:
    """Why the recipe's shadow judge may not judge ``scenario`` (empty when it may): it
    is the model serving the scenario, one of the arms (``judge_arm_overlap``)."""
    shadow = recipe.gate.shadow
    if shadow is None or shadow.judge is None:
        return []
    upstream_name, upstream = settings.upstream_for(scenario)
    serving = settings.scenario(scenario).model or upstream.model
    problem = judge_arm_overlap(shadow.judge, scenario, upstream_name, [serving])
    return [] if problem is None else [problem]
