"""Finding learner classes by ``type:`` name in the ``reef.learners`` entry-point group.

The built-ins register in ``pyproject.toml`` exactly as a plugin would; a test or an
embedding application may build a ``LearnerRegistry`` from an explicit mapping instead.
Entry points are loaded only when their type is used, so listing names imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import ValidationError

from reef.core.errors import InvalidInputError
from reef.learning.base import Learner, LearnerConfig

LEARNER_GROUP = "reef.learners"


class UnknownLearnerError(InvalidInputError):
    """A recipe names a learner type that nothing registered."""


class LearnerSettingsError(InvalidInputError):
    """A learner's settings in a recipe do not fit its ``config_model``."""


class LearnerRegistry:
    """Learner classes by type name: the ``reef.learners`` entry points, plus (or instead
    of) ``classes`` given here, which win over entry points of the same name."""

    def __init__(
        self, classes: Mapping[str, type[Learner]] | None = None, entry_points_too: bool = True
    ) -> None:
        self._entry_points: dict[str, EntryPoint] = {}
        if entry_points_too:
            self._entry_points = {ep.name: ep for ep in entry_points(group=LEARNER_GROUP)}
        self._classes: dict[str, type[Learner]] = dict(classes or {})

    def known(self) -> list[str]:
        """Every registered type name, sorted."""
        return sorted(self._entry_points.keys() | self._classes.keys())

    def get(self, type_name: str) -> type[Learner]:
        """The learner class for ``type_name``; raises ``UnknownLearnerError`` listing the
        known names, or ``InvalidInputError`` when the entry point is not a ``Learner``."""
        if type_name in self._classes:
            return self._classes[type_name]
        entry = self._entry_points.get(type_name)
        if entry is None:
            raise UnknownLearnerError(
                f"unknown learner type {type_name!r}; known types: {', '.join(self.known())}"
            )
        loaded = entry.load()
        if not (isinstance(loaded, type) and issubclass(loaded, Learner)):
            raise InvalidInputError(
                f"entry point {type_name!r} = {entry.value!r} is not a reef Learner class"
            )
        self._classes[type_name] = loaded
        return loaded

    def config(self, type_name: str, settings: Mapping[str, Any], where: str) -> LearnerConfig:
        """Validate ``settings`` with the learner's ``config_model``; errors name each key
        under ``where`` (e.g. ``learners[0]``)."""
        cls = self.get(type_name)
        try:
            return cls.config_model.model_validate(dict(settings))
        except ValidationError as error:
            lines = [f"invalid settings for learner {type_name!r} at {where}:"]
            allowed = ", ".join(sorted(["type", *cls.config_model.model_fields]))
            for problem in error.errors():
                key = ".".join([where, *(str(p) for p in problem["loc"])])
                if problem["type"] == "extra_forbidden":
                    lines.append(f"  unknown key {key!r}; allowed keys here: {allowed}")
                else:
                    lines.append(f"  {key}: {problem['msg']}")
            raise LearnerSettingsError("\n".join(lines)) from error

    def build(self, type_name: str, settings: Mapping[str, Any], where: str) -> Learner:
        """A learner instance with validated settings."""
        return self.get(type_name)(self.config(type_name, settings, where))
