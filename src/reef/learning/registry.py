"""Finding learner classes by ``type:`` name in the ``reef.learners`` entry-point group.

The built-ins register in ``pyproject.toml`` exactly as a plugin would; a test or an
embedding application may build a ``LearnerRegistry`` from an explicit mapping instead.
Entry points are loaded only when their type is used, so listing names imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reef.core.errors import InvalidInputError
from reef.core.plugins import PluginRegistry
from reef.learning.base import Learner, LearnerConfig

LEARNER_GROUP = "reef.learners"


class UnknownLearnerError(InvalidInputError):
    """A recipe names a learner type that nothing registered."""


class LearnerSettingsError(InvalidInputError):
    """A learner's settings in a recipe do not fit its ``config_model``."""


class LearnerRegistry(PluginRegistry[Learner, LearnerConfig]):
    """Learner classes by type name: the ``reef.learners`` entry points, plus (or instead
    of) ``classes`` given here, which win over entry points of the same name."""

    group = LEARNER_GROUP
    kind = "learner"
    base = Learner
    unknown_error = UnknownLearnerError
    settings_error = LearnerSettingsError

    def build(self, type_name: str, settings: Mapping[str, Any], where: str) -> Learner:
        """A learner instance with validated settings."""
        return self.get(type_name)(self.config(type_name, settings, where))
